// Python bindings of the topology subsystem (src/topo): minincl._core.topo_*.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "../topo/topo.h"
#include "gil.h"

namespace py = pybind11;

void bindTopo(py::module_& m) {
  using namespace mncl::topo;

  m.def(
      "topo_report",
      [](std::optional<std::string> xml, std::optional<std::string> dump, bool json, int nranks) {
        ReportOptions o;
        o.xmlPath = xml.value_or("");
        o.dumpPath = dump.value_or("");
        o.json = json;
        o.nRanks = nranks;
        return mncl::py_gil::withoutGil([&] { return report(o); });
      },
      py::arg("xml") = py::none(), py::arg("dump") = py::none(), py::arg("json") = false,
      py::arg("nranks") = 0,
      "The topology report `minincl topo` prints: nvidia-smi style matrix, CPU/NUMA affinity,\n"
      "rings and trees. xml: load this file instead of detecting (else MININCL_TOPO_FILE);\n"
      "dump: write the topology as XML there (else MININCL_TOPO_DUMP_FILE); json: JSON output.");

  m.def(
      "topo_search_json",
      [](const std::string& xml, int nranks) {
        return mncl::py_gil::withoutGil([&] {
          auto sys = loadXml(xml);
          return renderJson(*sys, search(*sys, nranks));
        });
      },
      py::arg("xml"), py::arg("nranks") = 0,
      "Load a topology XML file and return the report as JSON (matrix, rings, trees).");

  m.def(
      "topo_dump_xml",
      [](std::optional<std::string> xml) {
        return mncl::py_gil::withoutGil([&] {
          auto sys = xml ? loadXml(*xml) : detect();
          return dumpXml(*sys);
        });
      },
      py::arg("xml") = py::none(), "The topology (loaded from xml, or detected) as XML.");

  m.def(
      "topo_detect_json",
      [](const std::string& sysRoot, int nranks) {
        return mncl::py_gil::withoutGil([&] {
          auto sys = detectFrom(sysRoot);
          return renderJson(*sys, search(*sys, nranks));
        });
      },
      py::arg("sys_root") = "/", py::arg("nranks") = 0,
      "Detect the topology from the sysfs tree under sys_root ('/' = this machine) and\n"
      "return the report as JSON; tests point it at a fake tree.");

  m.def(
      "topo_detect_xml",
      [](const std::string& sysRoot) {
        return mncl::py_gil::withoutGil([&] { return dumpXml(*detectFrom(sysRoot)); });
      },
      py::arg("sys_root") = "/", "Detect the topology under sys_root and dump it as XML.");
}
