# SPDX-License-Identifier: MIT
# The FUSE front end: the flexfs binary and its mount(8) helper names.
# Included from fs/CMakeLists.txt when FLEXFS_WITH_FUSE is ON.
add_executable(flexfs fuse_main.c fuse_ll.c)
target_compile_definitions(flexfs PRIVATE FLEXFS_VERSION="${PROJECT_VERSION}")
target_link_libraries(flexfs PRIVATE flx_fs flx_reshard flx_resolver flx_gpu
  flx_mountopts PkgConfig::FUSE3 Threads::Threads)

# Build tree: mount.flexfs next to the binary, so tests can exercise the
# helper personality (argv[0] = mount.*) without installing.
add_custom_command(TARGET flexfs POST_BUILD
  COMMAND ${CMAKE_COMMAND} -E create_symlink flexfs
    $<TARGET_FILE_DIR:flexfs>/mount.flexfs
  VERBATIM)

install(TARGETS flexfs DESTINATION ${CMAKE_INSTALL_BINDIR})

# mount(8) looks for helpers in /sbin, /sbin/fs.d and /sbin/fs only (never
# /usr/local/sbin), so the links go there whatever the prefix; empty
# disables them (unprivileged installs into a private prefix).
set(FLEXFS_MOUNT_HELPER_DIR "/sbin" CACHE PATH
  "Where to install mount.flexfs and mount.fuse.flexfs (empty: skip)")
if(FLEXFS_MOUNT_HELPER_DIR)
  # Relative links are computed at install time (cmake --install --prefix
  # may differ from the configured prefix) between the real directories:
  # on merged-/usr systems /sbin is a symlink to usr/sbin, and a link
  # computed from "/sbin" would dangle.
  install(CODE "
    set(_dir \"\$ENV{DESTDIR}${FLEXFS_MOUNT_HELPER_DIR}\")
    set(_bin \"${CMAKE_INSTALL_BINDIR}\")
    if(NOT IS_ABSOLUTE \"\${_bin}\")
      set(_bin \"\${CMAKE_INSTALL_PREFIX}/\${_bin}\")
    endif()
    set(_bin \"\$ENV{DESTDIR}\${_bin}\")
    file(MAKE_DIRECTORY \"\${_dir}\")
    file(REAL_PATH \"\${_dir}\" _dir_real)
    file(REAL_PATH \"\${_bin}\" _bin_real)
    file(RELATIVE_PATH _rel \"\${_dir_real}\" \"\${_bin_real}/flexfs\")
    foreach(_name mount.flexfs mount.fuse.flexfs)
      message(STATUS \"Installing: \${_dir}/\${_name} -> \${_rel}\")
      file(CREATE_LINK \"\${_rel}\" \"\${_dir}/\${_name}\" SYMBOLIC)
      # listed in install_manifest.txt (as file(INSTALL) lists its files:
      # without DESTDIR), so that the uninstall target removes them
      list(APPEND CMAKE_INSTALL_MANIFEST_FILES
        \"${FLEXFS_MOUNT_HELPER_DIR}/\${_name}\")
    endforeach()
  ")
endif()

# The distributed mount (-o mpi): its MPI side (resolver/remote/, a remote
# file backend of the checkpoint, ckpt.h) is linked into the daemon only.
if(FLEXFS_WITH_MPI)
  target_sources(flexfs PRIVATE ${PROJECT_SOURCE_DIR}/resolver/remote/mpi_mount.c)
  target_compile_definitions(flexfs PRIVATE FLEXFS_WITH_MPI=1)
  target_link_libraries(flexfs PRIVATE PkgConfig::MPI PkgConfig::XXHASH)
endif()
