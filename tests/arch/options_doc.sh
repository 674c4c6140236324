#!/bin/sh
# SPDX-License-Identifier: MIT
# Every option is written once (the tables, mountopts/optdoc.h): for each
# program, the -o options it accepts (flexfs-optdoc names) are exactly
# those its --help names and those its man page names, and each accepted
# one is taken as the program's own when tried (flexfs-inspect and
# flexfs-materialize warn "ignoring mount option" for any other); the
# README's block between <!-- options:begin --> and <!-- options:end -->
# is what "flexfs-optdoc markdown" prints.
#
# Usage: options_doc.sh SRCDIR BUILDDIR
set -eu
src=$1
build=$2
optdoc=$build/tools/flexfs-optdoc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

bin_of() {
	case $1 in
	flexfs) echo "$build/fs/flexfs" ;;
	*) echo "$build/tools/$1" ;;
	esac
}

for page in flexfs:8 flexfs-inspect:1 flexfs-materialize:1; do
	prog=${page%%:*}
	sec=${page#*:}
	bin=$(bin_of "$prog")
	"$optdoc" names "$prog" | sort >"$tmp/table"
	[ -s "$tmp/table" ] || { echo "$prog: no options in the tables"; fail=1; }
	if [ -x "$bin" ]; then
		# flexfs's help goes on with libfuse's own options
		"$bin" --help 2>&1 | sed '/^libfuse options:/,$d' |
			grep -oE '^ *-o [a-z_][a-z_0-9]*' | awk '{print $2}' |
			sort >"$tmp/help"
		if ! cmp -s "$tmp/table" "$tmp/help"; then
			echo "$prog: --help and the tables differ (< tables, > help):"
			diff "$tmp/table" "$tmp/help" || true
			fail=1
		fi
	else
		echo "$prog: not built, --help not checked"
	fi
	man=$build/man/$prog.$sec
	grep -oE '^\.B \\-o [a-z_][a-z_0-9]*' "$man" | awk '{print $3}' |
		sort >"$tmp/man"
	if ! cmp -s "$tmp/table" "$tmp/man"; then
		echo "$prog: $man and the tables differ (< tables, > man):"
		diff "$tmp/table" "$tmp/man" || true
		fail=1
	fi
	grep -q "^\.TH $(echo "$prog" | tr a-z- A-Z-) $sec " "$man" || {
		echo "$man: no .TH line for section $sec"
		fail=1
	}
	# tried: an accepted option is never handed on as a stranger's
	case $prog in flexfs) continue ;; esac
	[ -x "$bin" ] || continue
	mkdir -p "$tmp/empty" "$tmp/out"
	args=
	[ "$prog" = flexfs-materialize ] && args=$tmp/out
	"$optdoc" names all | sort -u >"$tmp/all"
	while read -r name; do
		"$bin" "$tmp/empty" $args -o "$name" >/dev/null 2>"$tmp/err" || true
		taken=yes
		grep -q "ignoring mount option '$name'" "$tmp/err" && taken=no
		want=no
		grep -qx "$name" "$tmp/table" && want=yes
		if [ $taken != $want ]; then
			echo "$prog: -o $name taken: $taken, in its tables: $want"
			fail=1
		fi
	done <"$tmp/all"
	"$bin" "$tmp/empty" $args -o no_such_option_x >/dev/null 2>"$tmp/err" || true
	if ! grep -q "ignoring mount option 'no_such_option_x'" "$tmp/err"; then
		echo "$prog: an unknown option was taken as its own"
		fail=1
	fi
done
grep -q 'mount\\&\?\.flexfs\|mount\.flexfs' "$build/man/flexfs.8" &&
	grep -q 'mount \\-t flexfs' "$build/man/flexfs.8" &&
	grep -q 'fstab' "$build/man/flexfs.8" || {
	echo "flexfs.8: mount.flexfs, mount -t flexfs or the fstab form missing"
	fail=1
}

# the README's block
sed -n '/^<!-- options:begin -->$/,/^<!-- options:end -->$/p' "$src/README.md" |
	sed '1d;$d' >"$tmp/readme"
"$optdoc" markdown >"$tmp/md"
if ! cmp -s "$tmp/readme" "$tmp/md"; then
	echo "README.md: the options block is not what 'flexfs-optdoc markdown' prints;"
	echo "regenerate it: tools/update-readme-options.sh BUILDDIR"
	diff "$tmp/md" "$tmp/readme" | head -20 || true
	fail=1
fi
[ $fail = 0 ] && echo "options_doc: ok"
exit $fail
