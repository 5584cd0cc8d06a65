#include "xml.h"

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mncl::topo {

const std::string* XmlElement::find(std::string_view key) const {
  for (const auto& [k, v] : attrs)
    if (k == key) return &v;
  return nullptr;
}

std::string XmlElement::get(std::string_view key, const std::string& fallback) const {
  const std::string* v = find(key);
  return v ? *v : fallback;
}

void XmlElement::set(const std::string& key, const std::string& value) {
  for (auto& [k, v] : attrs)
    if (k == key) { v = value; return; }
  attrs.emplace_back(key, value);
}

XmlElement& XmlElement::add(const std::string& childName) {
  children.emplace_back();
  children.back().name = childName;
  return children.back();
}

namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::string& source) : text_(text), source_(source) {}

  XmlElement parseDocument() {
    checkUtf8();
    skipMisc();
    if (atEnd()) fail("no root element (empty file?)");
    if (peek() != '<') fail("expected '<' to start the root element");
    XmlElement root = parseElement(1);
    skipMisc();
    if (!atEnd()) fail("unexpected content after the root element </" + root.name + ">");
    return root;
  }

 private:
  const std::string& text_;
  const std::string& source_;
  size_t pos_ = 0;
  int line_ = 1;

  [[noreturn]] void fail(const std::string& what, int line = 0) const {
    throw XmlError(source_ + ":" + std::to_string(line ? line : line_) + ": " + what);
  }
  // The file's text must be UTF-8 (as XML's default): its values reach reports and Python
  // strings, where another encoding's bytes fail far from the file that had them.
  void checkUtf8() const {
    int line = 1;
    for (size_t i = 0; i < text_.size();) {
      size_t length = utf8Length(std::string_view(text_).substr(i));
      if (length == 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text_[i]));
        fail(std::string("byte ") + hex + " is not UTF-8 text", line);
      }
      if (text_[i] == '\n') ++line;
      i += length;
    }
  }
  // The length of the well-formed UTF-8 sequence `s` starts with (RFC 3629), or 0.
  static size_t utf8Length(std::string_view s) {
    auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    unsigned char b = at(0);
    if (b < 0x80) return 1;
    size_t length = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (length == 0 || s.size() < length) return 0;
    // (the second byte's range excludes overlong forms, surrogates and code points past U+10FFFF)
    unsigned char low = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
    unsigned char high = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
    if (at(1) < low || at(1) > high) return 0;
    for (size_t k = 2; k < length; ++k)
      if ((at(k) & 0xC0) != 0x80) return 0;
    return length;
  }
  bool atEnd() const { return pos_ >= text_.size(); }
  char peek() const { return atEnd() ? '\0' : text_[pos_]; }
  bool startsWith(std::string_view s) const { return text_.compare(pos_, s.size(), s) == 0; }
  void advance(size_t n = 1) {
    for (size_t i = 0; i < n && !atEnd(); ++i, ++pos_)
      if (text_[pos_] == '\n') ++line_;
  }
  void skipSpace() {
    while (!atEnd() && std::isspace(static_cast<unsigned char>(peek()))) advance();
  }
  void skipPast(std::string_view terminator, const char* what) {
    int startLine = line_;
    size_t end = text_.find(terminator, pos_);
    if (end == std::string::npos) fail(std::string("unterminated ") + what, startLine);
    advance(end + terminator.size() - pos_);
  }
  // Whitespace, comments, declarations and (ignored) text between elements.
  void skipMisc() {
    for (;;) {
      skipSpace();
      if (startsWith("\xEF\xBB\xBF")) advance(3);
      else if (startsWith("<!--")) skipPast("-->", "comment");
      else if (startsWith("<?")) skipPast("?>", "<?...?> declaration");
      else if (startsWith("<!")) skipPast(">", "<!...> declaration");
      else return;
    }
  }
  void skipText() {
    while (!atEnd() && peek() != '<') advance();
  }

  static bool isNameChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
           c == ':';
  }
  std::string parseName(const char* what) {
    size_t start = pos_;
    while (!atEnd() && isNameChar(peek())) advance();
    if (start == pos_) {
      std::string got = atEnd() ? "end of file" : std::string("'") + peek() + "'";
      fail(std::string("expected ") + what + ", found " + got);
    }
    return text_.substr(start, pos_ - start);
  }

  std::string decodeEntities(const std::string& raw, int line) const {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '&') { out += raw[i]; continue; }
      size_t semi = raw.find(';', i);
      if (semi == std::string::npos) fail("'&' without ';' in attribute value", line);
      std::string entity = raw.substr(i + 1, semi - i - 1);
      if (entity == "amp") out += '&';
      else if (entity == "lt") out += '<';
      else if (entity == "gt") out += '>';
      else if (entity == "quot") out += '"';
      else if (entity == "apos") out += '\'';
      else if (entity.size() > 1 && entity[0] == '#') {
        bool hex = entity[1] == 'x';
        std::string digits = entity.substr(hex ? 2 : 1);
        // (Digits only: strtol alone would take a sign, spaces and a second "0x".)
        bool wellFormed = !digits.empty() && digits.size() <= 8 &&
                          digits.find_first_not_of(hex ? "0123456789abcdefABCDEF" : "0123456789") == std::string::npos;
        long code = wellFormed ? std::strtol(digits.c_str(), nullptr, hex ? 16 : 10) : 0;
        if (code <= 0 || code > 127) fail("unsupported character reference &" + entity + ";", line);
        out += static_cast<char>(code);
      } else {
        fail("unknown entity &" + entity + ";", line);
      }
      i = semi;
    }
    return out;
  }

  void parseAttribute(XmlElement& e) {
    std::string key = parseName("attribute name");
    skipSpace();
    if (peek() != '=') fail("expected '=' after attribute '" + key + "'");
    advance();
    skipSpace();
    char quote = peek();
    if (quote != '"' && quote != '\'') fail("attribute '" + key + "' value must be quoted");
    int line = line_;
    advance();
    size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) fail("unterminated value of attribute '" + key + "'", line);
    std::string raw = text_.substr(pos_, end - pos_);
    if (raw.find('<') != std::string::npos) fail("'<' inside value of attribute '" + key + "'", line);
    advance(end + 1 - pos_);
    if (e.find(key)) fail("duplicate attribute '" + key + "'", line);
    e.attrs.emplace_back(key, decodeEntities(raw, line));
  }

  // Elements nest deeper than any machine's topology (system, CPU, PCI switches, GPU, link)
  // only in a broken or hostile file; the parser recurses per level, so it stops there
  // rather than overflow its stack.
  static constexpr int kMaxDepth = 64;

  XmlElement parseElement(int depth) {
    if (depth > kMaxDepth) fail("elements nest deeper than " + std::to_string(kMaxDepth) + " levels");
    XmlElement e;
    e.line = line_;
    advance();  // '<'
    e.name = parseName("element name");
    for (;;) {
      skipSpace();
      if (atEnd()) fail("end of file inside the start tag of <" + e.name + ">", e.line);
      if (startsWith("/>")) { advance(2); return e; }
      if (peek() == '>') { advance(); break; }
      parseAttribute(e);
    }
    parseContent(e, depth);
    return e;
  }

  void parseContent(XmlElement& e, int depth) {
    for (;;) {
      skipMisc();
      skipText();
      if (atEnd()) fail("<" + e.name + "> is never closed", e.line);
      if (startsWith("<!--") || startsWith("<?") || startsWith("<!")) continue;
      if (startsWith("</")) {
        advance(2);
        std::string closing = parseName("closing tag name");
        if (closing != e.name)
          fail("</" + closing + "> does not match <" + e.name + "> opened on line " +
               std::to_string(e.line));
        skipSpace();
        if (peek() != '>') fail("expected '>' to end </" + closing + ">");
        advance();
        return;
      }
      e.children.push_back(parseElement(depth + 1));
    }
  }
};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

void writeElement(const XmlElement& e, int depth, std::string& out) {
  out.append(2 * depth, ' ');
  out += "<" + e.name;
  for (const auto& [k, v] : e.attrs) out += " " + k + "=\"" + escape(v) + "\"";
  if (e.children.empty()) { out += "/>\n"; return; }
  out += ">\n";
  for (const XmlElement& c : e.children) writeElement(c, depth + 1, out);
  out.append(2 * depth, ' ');
  out += "</" + e.name + ">\n";
}

}  // namespace

XmlElement parseXml(const std::string& text, const std::string& sourceName) {
  return Parser(text, sourceName).parseDocument();
}

XmlElement parseXmlFile(const std::string& path) {
  // Only a regular file of a sane size: a FIFO would block the init, /dev/zero fill memory,
  // and a directory read as an empty file.
  constexpr std::uintmax_t kMaxBytes = 64u << 20;
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (ec) throw XmlError(path + ": cannot open topology file: " + ec.message());
  if (!std::filesystem::is_regular_file(status)) throw XmlError(path + ": the topology file is not a regular file");
  std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (!ec && bytes > kMaxBytes)
    throw XmlError(path + ": the topology file is " + std::to_string(bytes) + " bytes, more than a topology takes (" +
                   std::to_string(kMaxBytes) + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw XmlError(path + ": cannot open topology file");
  std::stringstream buf;
  buf << in.rdbuf();
  return parseXml(buf.str(), path);
}

std::string writeXml(const XmlElement& root) {
  std::string out;
  writeElement(root, 0, out);
  return out;
}

}  // namespace mncl::topo
