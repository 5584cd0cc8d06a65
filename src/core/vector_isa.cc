#include "vector_isa.h"

#include "../../cuda/cpu/narrow_float.h"
#include "env.h"
#include "error.h"

namespace mncl {

std::string applyVectorIsaSetting() {
  std::string want = env::str("MININCL_CPU_ISA");
  auto isa = want.empty() ? dev::bestVectorIsa() : dev::VectorIsa::count;
  for (int i = 0; i < (int)dev::VectorIsa::count; ++i) {
    if (want == dev::vectorIsaName((dev::VectorIsa)i)) isa = (dev::VectorIsa)i;
  }
  MNCL_CHECK(isa != dev::VectorIsa::count, mnclInvalidArgument,
             "MININCL_CPU_ISA=\"" + want + "\" is not one of portable, avx2, avx512");
  MNCL_CHECK(isa <= dev::bestVectorIsa(), mnclInvalidArgument,
             "MININCL_CPU_ISA=" + want + ": this CPU has at most " + dev::vectorIsaName(dev::bestVectorIsa()));
  dev::useVectorIsa(isa);
  return dev::vectorIsaName(isa);
}

std::string vectorIsaInUse() { return dev::vectorIsaName(dev::vectorIsa()); }

}  // namespace mncl
