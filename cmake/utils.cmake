# Helpers for CMakeLists.txt: find the installed torch and define a torch extension module.

# Locate torch through the given Python interpreter and load its CMake package.
function(prism_find_torch PYTHON)
  execute_process(
    COMMAND ${PYTHON} -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "vllm-prism: torch is not importable by ${PYTHON}")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${TORCH_PREFIX})
  find_package(Torch REQUIRED)
  execute_process(
    COMMAND ${PYTHON} -c "import sysconfig; print(sysconfig.get_paths()['include'])"
    OUTPUT_VARIABLE PY_INCLUDE OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(
    COMMAND ${PYTHON} -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"
    OUTPUT_VARIABLE PY_EXT_SUFFIX OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(TORCH_LIBRARIES ${TORCH_LIBRARIES} PARENT_SCOPE)
  set(TORCH_INCLUDE_DIRS ${TORCH_INCLUDE_DIRS} PARENT_SCOPE)
  # find_package(Torch) sets this in the function's scope only; prism_define_extension needs
  # it to find libtorch_python.
  set(TORCH_INSTALL_PREFIX ${TORCH_INSTALL_PREFIX} PARENT_SCOPE)
  set(PRISM_PY_INCLUDE ${PY_INCLUDE} PARENT_SCOPE)
  set(PRISM_PY_EXT_SUFFIX ${PY_EXT_SUFFIX} PARENT_SCOPE)
endfunction()

# prism_define_extension(NAME SOURCES ... INCLUDE_DIRS ...): a Python extension module that
# registers torch custom ops (TORCH_LIBRARY) and links against torch.
function(prism_define_extension NAME)
  cmake_parse_arguments(ARG "" "" "SOURCES;INCLUDE_DIRS" ${ARGN})
  add_library(${NAME} MODULE ${ARG_SOURCES})
  set_target_properties(${NAME} PROPERTIES PREFIX "" SUFFIX "${PRISM_PY_EXT_SUFFIX}")
  target_include_directories(${NAME} PRIVATE ${ARG_INCLUDE_DIRS} ${PRISM_PY_INCLUDE} ${TORCH_INCLUDE_DIRS})
  target_compile_definitions(${NAME} PRIVATE TORCH_EXTENSION_NAME=${NAME})
  target_compile_options(${NAME} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -O3 --use_fast_math>)
  # Link torch's C++ and Python bindings (the module is imported by Python).
  find_library(TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib" REQUIRED)
  target_link_libraries(${NAME} PRIVATE ${TORCH_LIBRARIES} ${TORCH_PYTHON_LIBRARY})
  prism_link_shared_libstdcxx(${NAME})
endfunction()

# The C++ runtime as the shared libstdc++.so.6, named ahead of the compiler's own -lstdc++.
# Where a toolchain has no libstdc++.so linker symlink (only libstdc++.a; seen on a CUDA 13 /
# g++ 13 image, 2026-12-01) or links it statically, the module would carry a second copy of
# libstdc++ next to the one torch and Python load: its locale facets (std::num_put's id) are
# not the process's, so formatting an integer into an error message (TORCH_CHECK(cond, "M = ",
# m)) fails or crashes the process instead of raising.
function(prism_link_shared_libstdcxx NAME)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  execute_process(
    COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
    OUTPUT_VARIABLE LIBSTDCXX OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${LIBSTDCXX}" AND EXISTS "${LIBSTDCXX}")
    target_link_libraries(${NAME} PRIVATE ${LIBSTDCXX})
  else()
    message(WARNING "vllm-prism: ${CMAKE_CXX_COMPILER} finds no shared libstdc++.so.6; "
                    "${NAME} may carry a static C++ runtime whose error messages break")
  endif()
endfunction()
