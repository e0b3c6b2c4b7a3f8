# What `cmake --install` puts where, the files other projects find diffuse by (CMake package
# diffuse::diffuse, pkg-config diffuse), the Python module, and the Debian package (cpack -G DEB).
#
#   bin/diffuse                                   the CLI
#   lib/libdiffuse.so.0                           the library (C API + C++ API)
#   lib/libdiffuse_sentencepiece.so               T5's SentencePiece shim (loaded at run time)
#   include/diffuse/*.h                           public headers (diffuse.h: the C API)
#   lib/cmake/diffuse/diffuseConfig*.cmake        find_package(diffuse) -> diffuse::diffuse
#   lib/pkgconfig/diffuse.pc                      pkg-config --cflags --libs diffuse
#   lib/python3/dist-packages/diffuse/            import diffuse (ctypes over libdiffuse)
#   share/diffuse/models/demo                     the demo model
include(CMakePackageConfigHelpers)

set(DIFFUSE_PYTHON_INSTALL_DIR "lib/python3/dist-packages" CACHE STRING
    "Where the Python module goes, relative to the prefix (Debian's python3 reads lib/python3/dist-packages under /usr)")
set(DIFFUSE_CMAKE_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/diffuse")

install(TARGETS diffuse RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS diffuse_shared EXPORT diffuseTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS diffuse_sentencepiece LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/diffuse DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/models/demo DESTINATION ${CMAKE_INSTALL_DATADIR}/diffuse/models)
if(EXISTS ${CMAKE_SOURCE_DIR}/models/demo-edit/model_index.json)
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/models/demo-edit DESTINATION ${CMAKE_INSTALL_DATADIR}/diffuse/models)
endif()

install(EXPORT diffuseTargets NAMESPACE diffuse:: DESTINATION ${DIFFUSE_CMAKE_INSTALL_DIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/diffuseConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/generated/diffuseConfig.cmake
                              INSTALL_DESTINATION ${DIFFUSE_CMAKE_INSTALL_DIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/generated/diffuseConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/generated/diffuseConfig.cmake
              ${CMAKE_BINARY_DIR}/generated/diffuseConfigVersion.cmake
        DESTINATION ${DIFFUSE_CMAKE_INSTALL_DIR})

# pkg-config: paths relative to the file, so the installed tree can move (--prefix at install).
file(RELATIVE_PATH DIFFUSE_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${CMAKE_SOURCE_DIR}/cmake/diffuse.pc.in ${CMAKE_BINARY_DIR}/generated/diffuse.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/generated/diffuse.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The Python module finds the library relative to itself.
file(RELATIVE_PATH DIFFUSE_PY_TO_LIB /prefix/${DIFFUSE_PYTHON_INSTALL_DIR}/diffuse
     /prefix/${CMAKE_INSTALL_LIBDIR}/libdiffuse.so.${PROJECT_VERSION_MAJOR})
file(WRITE ${CMAKE_BINARY_DIR}/generated/python/_paths.py
     "# Written by CMake at install: where libdiffuse is, relative to this package.\nLIBRARY = \"${DIFFUSE_PY_TO_LIB}\"\n")
file(GLOB DIFFUSE_PYTHON_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bindings/python/diffuse/*.py)
install(FILES ${DIFFUSE_PYTHON_SOURCES} ${CMAKE_BINARY_DIR}/generated/python/_paths.py
        DESTINATION ${DIFFUSE_PYTHON_INSTALL_DIR}/diffuse)

# cpack -G DEB (from the build folder): a .deb of all of the above under /usr, its dependencies
# worked out by dpkg-shlibdeps from the libraries it links (libtorch, ICU, PCRE2, ...).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME diffuse)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "diffuse maintainers <maintainers@users.noreply.a-seed-7e0328d7.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Diffusion image models (Stable Diffusion, HiDream) on CPU, CUDA and Ascend NPU")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION graphics)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3-numpy")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-pil")
include(CPack)
