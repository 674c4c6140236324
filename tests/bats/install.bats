#!/usr/bin/env bats
# SPDX-License-Identifier: MIT
# Packaging: cmake --install of this build tree into a DESTDIR under the
# test's directory lists in install_manifest.txt exactly the files and links
# it made (the mount(8) helper links under /sbin included), and the
# uninstall target removes every one of them.  The build tree's own
# install_manifest.txt is put back as it was.

load helpers

setup() {
	BUILD_ROOT=${FLEXFS_BUILD_ROOT:-$(dirname "$FLEXFS_BUILD")}
	[[ -f $BUILD_ROOT/cmake_install.cmake ]] || skip "no build tree at $BUILD_ROOT"
	command -v cmake >/dev/null || skip "cmake not found"
	MANIFEST=$BUILD_ROOT/install_manifest.txt
	SAVED=$BATS_TEST_TMPDIR/manifest.saved
	rm -f "$SAVED"
	[[ ! -f $MANIFEST ]] || cp -p "$MANIFEST" "$SAVED"
}

teardown() {
	if [[ -f $SAVED ]]; then
		cp -p "$SAVED" "$MANIFEST"
	else
		rm -f "$MANIFEST"
	fi
}

# installed DIR: every file and link under DIR, as absolute paths without DIR
installed() {
	(cd "$1" && find . \( -type f -o -type l \) -printf '/%P\n' | LC_ALL=C sort)
}

@test "install: the manifest lists every installed file and link; uninstall removes them all" {
	local d=$BATS_TEST_TMPDIR/root prefix=/opt/flexfs-test

	DESTDIR=$d run cmake --install "$BUILD_ROOT" --prefix "$prefix"
	echo "$output"
	[ "$status" -eq 0 ]
	installed "$d" >"$BATS_TEST_TMPDIR/found"
	LC_ALL=C sort "$MANIFEST" >"$BATS_TEST_TMPDIR/listed"
	diff "$BATS_TEST_TMPDIR/found" "$BATS_TEST_TMPDIR/listed"
	grep -qx "$prefix/bin/flexfs-inspect" "$BATS_TEST_TMPDIR/listed"
	grep -qx "$prefix/share/doc/flexfs/LICENSE" "$BATS_TEST_TMPDIR/listed"
	cmp "$d$prefix/share/doc/flexfs/LICENSE" "$FLEXFS_SRC/LICENSE"
	if [[ -x $FLEXFS_BIN ]]; then
		# the helper links, where the FUSE front end is built
		local helper
		for helper in mount.flexfs mount.fuse.flexfs; do
			grep -qx "/sbin/$helper" "$BATS_TEST_TMPDIR/listed"
			[ -L "$d/sbin/$helper" ]
			[ "$(readlink -f "$d/sbin/$helper")" = "$(readlink -f "$d$prefix/bin/flexfs")" ]
		done
	fi
	DESTDIR=$d run cmake --build "$BUILD_ROOT" --target uninstall
	echo "$output"
	[ "$status" -eq 0 ]
	[ -z "$(installed "$d")" ]
	# flexfs's own directories go too; the standard ones stay
	[ ! -e "$d$prefix/share/flexfs" ]
	[ ! -e "$d$prefix/share/doc/flexfs" ]
	[ -d "$d$prefix/bin" ]
}

@test "install: uninstall without an install says so and fails" {
	rm -f "$MANIFEST"
	run cmake --build "$BUILD_ROOT" --target uninstall
	echo "$output"
	[ "$status" -ne 0 ]
	[[ $output == *"install_manifest.txt: no such file (nothing was"* ]]
}
