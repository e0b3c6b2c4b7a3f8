# Ascend NPU support: links libtorch_npu (torch_npu's C++-only library, built with
# `python3 build_libtorch_npu.py` from the torch_npu branch that matches the libtorch in use)
# and CANN's runtime (libascendcl). Included by CMakeLists.txt when DIFFUSE_WITH_TORCH_NPU=ON.
#
# Inputs (any one of them locates libtorch_npu):
#   -DTorch_npu_DIR=<libtorch_npu>/share/cmake/Torch_npu   (its CMake package)
#   -DTORCH_NPU_ROOT=<libtorch_npu>  or env TORCH_NPU_INSTALL_PREFIX
# CANN is found through ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH, which
# `source /usr/local/Ascend/ascend-toolkit/set_env.sh` exports.

set(TORCH_NPU_ROOT "$ENV{TORCH_NPU_INSTALL_PREFIX}" CACHE PATH "libtorch_npu install prefix")

find_package(Torch_npu CONFIG QUIET)
if(NOT Torch_npu_FOUND)
  find_path(TORCH_NPU_INCLUDE_DIRS torch_npu/csrc/libs/init_npu.h
            HINTS "${TORCH_NPU_ROOT}/include")
  find_library(TORCH_NPU_LIBRARY torch_npu HINTS "${TORCH_NPU_ROOT}/lib")
  if(NOT TORCH_NPU_INCLUDE_DIRS OR NOT TORCH_NPU_LIBRARY)
    message(FATAL_ERROR
      "DIFFUSE_WITH_TORCH_NPU=ON but libtorch_npu was not found. Build it with "
      "`python3 build_libtorch_npu.py` in the torch_npu source tree of the branch matching your "
      "libtorch, then pass -DTORCH_NPU_ROOT=<path>/libtorch_npu (see docs/ascend.md).")
  endif()
  set(TORCH_NPU_LIBRARIES ${TORCH_NPU_LIBRARY})
endif()

set(_ascend_home "$ENV{ASCEND_TOOLKIT_HOME}")
if(NOT _ascend_home)
  set(_ascend_home "$ENV{ASCEND_HOME_PATH}")
endif()
if(NOT _ascend_home)
  set(_ascend_home "/usr/local/Ascend/ascend-toolkit/latest")
endif()
find_library(ASCENDCL_LIBRARY ascendcl HINTS "${_ascend_home}/lib64" "${_ascend_home}/runtime/lib64")
if(NOT ASCENDCL_LIBRARY)
  message(FATAL_ERROR
    "DIFFUSE_WITH_TORCH_NPU=ON but CANN's libascendcl was not found under '${_ascend_home}'. "
    "Run `source /usr/local/Ascend/ascend-toolkit/set_env.sh` before configuring.")
endif()

# libtorch, libtorch_npu and this project must agree on the libstdc++ ABI. torch_npu's package
# records its choice in TORCH_NPU_CXX_FALGS (sic); libtorch's is in TORCH_CXX_FLAGS.
if(TORCH_NPU_CXX_FALGS AND TORCH_CXX_FLAGS AND NOT TORCH_NPU_CXX_FALGS STREQUAL TORCH_CXX_FLAGS)
  message(FATAL_ERROR
    "libtorch (${TORCH_CXX_FLAGS}) and libtorch_npu (${TORCH_NPU_CXX_FALGS}) were built with "
    "different _GLIBCXX_USE_CXX11_ABI settings; rebuild libtorch_npu with "
    "`export _GLIBCXX_USE_CXX11_ABI=<libtorch's value>`.")
endif()
if(TORCH_CXX_FLAGS)
  separate_arguments(_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(diffuse_core PUBLIC ${_torch_cxx_flags})
endif()

# The pip wheel keeps CANN's ACL/HCCL headers that torch_npu ships under include/third_party.
foreach(_dir IN LISTS TORCH_NPU_INCLUDE_DIRS)
  foreach(_sub third_party/acl/inc third_party/hccl/inc)
    if(EXISTS "${_dir}/${_sub}")
      list(APPEND TORCH_NPU_INCLUDE_DIRS "${_dir}/${_sub}")
    endif()
  endforeach()
endforeach()
# torch_npu's HCCL process group (multi-card --devices) includes <c10d/...> (torch's c10d folder
# as an include root) and, through torch_npu/csrc/npu/Event.h, <Python.h>. Without Python's
# headers diffuse builds without HCCL and says so (scripts/check_torch_npu.sh compiles both).
foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${_dir}/torch/csrc/distributed/c10d")
    list(APPEND TORCH_NPU_INCLUDE_DIRS "${_dir}/torch/csrc/distributed")
  endif()
endforeach()
find_package(Python3 COMPONENTS Development.Module QUIET)
if(Python3_Development.Module_FOUND)
  list(APPEND TORCH_NPU_INCLUDE_DIRS ${Python3_INCLUDE_DIRS})
else()
  target_compile_definitions(diffuse_core PUBLIC DIFFUSE_WITHOUT_HCCL=1)
  message(WARNING "diffuse: Python's headers not found: no HCCL process group (multi-npu "
                  "--devices) in this build (torch_npu's ProcessGroupHCCL.hpp includes Python.h)")
endif()
target_include_directories(diffuse_core PUBLIC ${TORCH_NPU_INCLUDE_DIRS})
target_link_libraries(diffuse_core PUBLIC ${TORCH_NPU_LIBRARIES} ${ASCENDCL_LIBRARY})
target_compile_definitions(diffuse_core PUBLIC DIFFUSE_WITH_TORCH_NPU=1)
message(STATUS "diffuse: Ascend NPU support via ${TORCH_NPU_LIBRARIES} (CANN: ${_ascend_home})")
