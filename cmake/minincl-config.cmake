# minincl's C API for CMake projects, as the Python package installs it:
#
#   find_package(minincl CONFIG REQUIRED)    # with -Dminincl_DIR=$(minincl config --cmake)
#   target_link_libraries(app PRIVATE minincl::minincl)
#
# minincl::minincl is libminincl.so with minincl.h's directory as its include directory; a
# program linked to it finds the library again when it runs (its build run path).
get_filename_component(_minincl_lib_dir "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
get_filename_component(_minincl_include_dir "${_minincl_lib_dir}/../include" ABSOLUTE)
if(NOT TARGET minincl::minincl)
  add_library(minincl::minincl SHARED IMPORTED)
  set_target_properties(minincl::minincl PROPERTIES
    IMPORTED_LOCATION "${_minincl_lib_dir}/libminincl.so"
    IMPORTED_SONAME "libminincl.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_minincl_include_dir}")
endif()
set(minincl_INCLUDE_DIR "${_minincl_include_dir}")
set(minincl_LIBRARY "${_minincl_lib_dir}/libminincl.so")
unset(_minincl_lib_dir)
unset(_minincl_include_dir)
