// A small XML reader and writer: elements and attributes only, which is all that
// topology files use. Comments, <?...?> declarations and <!DOCTYPE> are skipped,
// text content is ignored, the five predefined entities and &#N; are decoded.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model.h"

namespace mncl::topo {

// A malformed file: the message starts with "<file>:<line>: ".
class XmlError : public TopoError {
 public:
  using TopoError::TopoError;
};

struct XmlElement {
  std::string name;
  int line = 0;  // where the start tag is, 1-based
  Attributes attrs;
  std::vector<XmlElement> children;

  const std::string* find(std::string_view key) const;
  std::string get(std::string_view key, const std::string& fallback = "") const;
  void set(const std::string& key, const std::string& value);  // replaces or appends
  XmlElement& add(const std::string& childName);
};

// `sourceName` only labels error messages.
XmlElement parseXml(const std::string& text, const std::string& sourceName);
XmlElement parseXmlFile(const std::string& path);  // throws XmlError if unreadable too
std::string writeXml(const XmlElement& root);

}  // namespace mncl::topo
