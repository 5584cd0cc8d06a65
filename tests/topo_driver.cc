// Standalone driver for the topology code, usable without the Python module:
//   g++ -std=c++20 -O1 src/topo/*.cc tests/topo_driver.cc -ldl -o /tmp/topo_driver
//   /tmp/topo_driver [--xml FILE] [--dump FILE] [--json] [--nranks N]
//   /tmp/topo_driver --sysroot DIR [--json]     detect from a fake /sys tree under DIR
//   /tmp/topo_driver --roundtrip FILE          load, dump, reload, dump: prints OK if equal
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "../src/topo/topo.h"

using namespace mncl::topo;

int main(int argc, char** argv) {
  ReportOptions options;
  std::string sysroot, roundtrip;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--xml") options.xmlPath = next();
    else if (a == "--dump") options.dumpPath = next();
    else if (a == "--json") options.json = true;
    else if (a == "--nranks") options.nRanks = std::atoi(next().c_str());
    else if (a == "--sysroot") sysroot = next();
    else if (a == "--roundtrip") roundtrip = next();
    else { std::cerr << "unknown argument " << a << "\n"; return 2; }
  }
  try {
    if (!roundtrip.empty()) {
      std::string first = dumpXml(*loadXml(roundtrip));
      std::string tmp = "/tmp/topo_driver_roundtrip.xml";
      FILE* f = std::fopen(tmp.c_str(), "w");
      std::fputs(first.c_str(), f);
      std::fclose(f);
      std::string second = dumpXml(*loadXml(tmp));
      std::cout << (first == second ? "OK\n" : "DIFFERENT\n" + first + "\n----\n" + second);
      return first == second ? 0 : 1;
    }
    if (!sysroot.empty()) {
      auto sys = detectFrom(sysroot);
      SearchResult r = search(*sys, options.nRanks);
      std::cout << (options.json ? renderJson(*sys, r) : renderText(*sys, r) + "\n" + dumpXml(*sys));
      return 0;
    }
    std::cout << report(options);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
