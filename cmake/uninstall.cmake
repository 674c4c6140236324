# SPDX-License-Identifier: MIT
# The uninstall target (cmake --build BUILD --target uninstall): removes
# every file and link install_manifest.txt lists, under $DESTDIR when it is
# set as at install, then the directories of flexfs's own left empty (those
# from a path component named flexfs down).  Run with -DMANIFEST=<build>/install_manifest.txt.
cmake_policy(VERSION 3.20)
if(NOT EXISTS "${MANIFEST}")
  message(FATAL_ERROR "${MANIFEST}: no such file (nothing was installed "
    "from this build tree)")
endif()
file(STRINGS "${MANIFEST}" _files)
set(_dirs)
foreach(_f IN LISTS _files)
  set(_p "$ENV{DESTDIR}${_f}")
  if(IS_SYMLINK "${_p}" OR EXISTS "${_p}")
    message(STATUS "Uninstalling: ${_p}")
    file(REMOVE "${_p}")
    if(IS_SYMLINK "${_p}" OR EXISTS "${_p}")
      message(FATAL_ERROR "${_p}: could not be removed")
    endif()
  else()
    message(STATUS "Not installed: ${_p}")
  endif()
  # the directories of the path from its first component named flexfs
  # down: /usr/share/flexfs/rules/x.json gives /usr/share/flexfs and
  # /usr/share/flexfs/rules
  string(REPLACE "/" ";" _parts "${_f}")
  list(POP_BACK _parts)
  set(_at "")
  set(_ours OFF)
  foreach(_c IN LISTS _parts)
    if(_c STREQUAL "")
      continue()
    endif()
    string(APPEND _at "/${_c}")
    if(_c STREQUAL "flexfs")
      set(_ours ON)
    endif()
    if(_ours)
      list(APPEND _dirs "$ENV{DESTDIR}${_at}")
    endif()
  endforeach()
endforeach()
# deepest first, so that share/flexfs/rules goes before share/flexfs
list(REMOVE_DUPLICATES _dirs)
list(SORT _dirs ORDER DESCENDING)
foreach(_d IN LISTS _dirs)
  file(GLOB _left LIST_DIRECTORIES true "${_d}/*" "${_d}/.*")
  if(IS_DIRECTORY "${_d}" AND NOT IS_SYMLINK "${_d}" AND NOT _left)
    message(STATUS "Removing empty directory: ${_d}")
    file(REMOVE_RECURSE "${_d}")
  endif()
endforeach()
