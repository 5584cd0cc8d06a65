// Environment variables: every MININCL_* setting is read through here.
#pragma once

#include <cstdint>
#include <string>

namespace mncl::env {

std::string str(const char* name, const std::string& fallback = "");
int64_t integer(const char* name, int64_t fallback);  // throws InvalidArgument on garbage
double seconds(const char* name, double fallback);    // "5", "2.5", "500ms"; also "inf"
// Seconds, above 0 (at least `lowest` where that is above 0) and below 1e9 s (~30 years: a
// bigger number is a typo, not a limit anyone means).
double limit(const char* name, double fallback, double lowest = 0);
int64_t bytes(const char* name, int64_t fallback);    // "65536", "64K", "1M"

}  // namespace mncl::env
