#!/usr/bin/env bash
# bench/build_passthrough_hp.sh: builds libfuse's example/passthrough_hp.cc
# from the source of the very libfuse release the system's libfuse3 is (Debian
# ships passthrough_ll.c among libfuse3-dev's examples, not passthrough_hp) and
# prints the binary's path (stdout; everything else goes to stderr).
#
# The source: LIBFUSE_SRC when given (a libfuse source tree, or its release
# tarball), else the Debian source package of the installed libfuse3-dev
# (`apt-get source fuse3=VERSION`, download only; its upstream tarball,
# libfuse's own release, is used as it is: Debian's patches do not touch the
# examples). When the system's apt has no deb-src entries, a private apt
# configuration under the cache dir lists the deb-src twins of the system's
# deb entries (the same mirrors, the system's archive keys; the system's apt
# configuration and lists are left as they are; no root needed).
#
# Idempotent: the cache dir keeps the two source files, where they came from
# (SOURCE) and a stamp of the build (libfuse version, sources' sha256, the
# compile command); a second run with nothing changed only prints the path.
# Environment: PASSTHROUGH_HP_DIR (cache dir, default build/passthrough_hp; the
# binary is DIR/passthrough_hp), LIBFUSE_SRC, CXX (g++).
# Exits non-zero with the reason on stderr when the source cannot be had or
# the build fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${PASSTHROUGH_HP_DIR:-$ROOT/build/passthrough_hp}
CXX=${CXX:-g++}
BIN=$DIR/passthrough_hp
SRC=$DIR/src

die() { echo "build_passthrough_hp.sh: $*" >&2; exit 1; }
log() { echo "build_passthrough_hp.sh: $*" >&2; }

command -v pkg-config > /dev/null || die "pkg-config not found (apt-get install pkg-config)"
VERSION=$(pkg-config --modversion fuse3 2> /dev/null) \
  || die "no fuse3 in pkg-config: install libfuse3-dev (the headers and library passthrough_hp builds against)"
command -v "$CXX" > /dev/null || die "$CXX not found (set CXX, or apt-get install g++)"
mkdir -p "$DIR"
exec 9> "$DIR/.lock"
flock 9  # one build at a time per cache dir
trap 'rm -rf "$DIR"/extract.* "$BIN.tmp"' EXIT

have_source() { [[ -s $SRC/passthrough_hp.cc && -s $SRC/cxxopts.hpp && -s $SRC/SOURCE && -s $SRC/VERSION ]]; }

src_version() {  # MESON_BUILD -> the version in libfuse's project() line
  sed -n "s/^project('libfuse3'.*version: *'\([^']*\)'.*/\1/p" "$1" | head -n 1
}

install_source() {  # TOP ORIGIN: take the two example files (and the version) of libfuse tree TOP
  [[ -f $1/example/passthrough_hp.cc && -f $1/example/cxxopts.hpp ]] \
    || die "$2 has no example/passthrough_hp.cc and example/cxxopts.hpp (libfuse < 3.10 has no passthrough_hp)"
  local v
  v=$(src_version "$1/meson.build" 2> /dev/null || true)
  [[ -n $v ]] || v=unknown
  [[ $v == "$VERSION" ]] || log "warning: $2 is libfuse $v, the system's libfuse3 is $VERSION"
  rm -rf "$SRC"; mkdir -p "$SRC"
  cp "$1/example/passthrough_hp.cc" "$1/example/cxxopts.hpp" "$SRC/"
  echo "$v" > "$SRC/VERSION"
  echo "$2" > "$SRC/SOURCE"
}

from_tarball() {  # TARBALL ORIGIN: a libfuse release tarball
  local tmp top
  tmp=$(mktemp -d "$DIR/extract.XXXXXX")
  tar -xf "$1" -C "$tmp" --wildcards --no-wildcards-match-slash \
    '*/meson.build' '*/example/passthrough_hp.cc' '*/example/cxxopts.hpp' 2> "$tmp/err" || true
  top=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -n 1)
  [[ -n $top ]] || { cat "$tmp/err" >&2; die "$1: not a libfuse release tarball"; }
  install_source "$top" "$2"
  rm -rf "$tmp"
}

from_debian() {  # the Debian source package of the installed libfuse3-dev
  if ! command -v apt-get > /dev/null || ! command -v dpkg-query > /dev/null; then
    die "no apt-get here: set LIBFUSE_SRC to a libfuse $VERSION source tree or release tarball"
  fi
  local pkg ver dl=$DIR/apt/download orig origin
  pkg=$(dpkg-query -W -f='${source:Package}' libfuse3-dev 2> /dev/null) \
    || die "libfuse3-dev is not installed as a Debian package: set LIBFUSE_SRC to a libfuse $VERSION source tree or release tarball"
  ver=$(dpkg-query -W -f='${source:Version}' libfuse3-dev)
  mkdir -p "$dl"
  origin="Debian source package $pkg $ver (upstream tarball as released, Debian's patches not applied)"
  # 1. the system's apt, when it has deb-src entries
  if (cd "$dl" && apt-get -q source --download-only "$pkg=$ver") > "$DIR/apt-source.log" 2>&1; then
    origin="$origin, via the system's deb-src entries"
  else
    # 2. a private apt configuration: the deb-src twins of the system's deb entries
    local A=$DIR/apt lists
    # shellcheck disable=SC2016  # apt's own $(FIELD) placeholders
    lists=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Created-By: Packages' 2> /dev/null | sort -u |
      awk '{c[$1 " " $2] = c[$1 " " $2] " " $3} END {for (k in c) print "deb-src " k c[k]}')
    [[ -n $lists ]] || die "apt has no deb entries to derive deb-src entries from; set LIBFUSE_SRC to a libfuse $VERSION source tree or release tarball"
    mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
    printf '%s\n' "$lists" > "$A/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$A/sources.list" -o "Dir::Etc::SourceParts=$A/nonexistent"
      -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache" -o "APT::Sandbox::User=$(id -un)")
    log "fetching the source of $pkg $ver (deb-src: $(paste -sd';' "$A/sources.list"))"
    if ! apt-get -q "${opts[@]}" update > "$DIR/apt-update.log" 2>&1 ||
       ! (cd "$dl" && apt-get -q "${opts[@]}" source --download-only "$pkg=$ver") > "$DIR/apt-source.log" 2>&1; then
      tail -n 5 "$DIR/apt-update.log" "$DIR/apt-source.log" >&2 2> /dev/null || true
      die "could not download the Debian source package $pkg=$ver (logs: $DIR/apt-update.log, $DIR/apt-source.log); set LIBFUSE_SRC to a libfuse $VERSION source tree or release tarball"
    fi
    origin="$origin, via deb-src twins of the system's apt entries"
  fi
  orig=$(find "$dl" -maxdepth 1 -name "${pkg}_${ver%-*}.orig.tar.*" ! -name '*.asc' | head -n 1)
  [[ -n $orig ]] || die "apt-get source $pkg=$ver left no ${pkg}_${ver%-*}.orig.tar.* in $dl"
  from_tarball "$orig" "$origin: $(basename "$orig")"
  rm -rf "$DIR/apt/lists" "$DIR/apt/cache"  # the private indexes (~20 MB): a fetch again updates anyway
}

if [[ -n ${LIBFUSE_SRC:-} ]]; then
  if [[ -d $LIBFUSE_SRC ]]; then install_source "$LIBFUSE_SRC" "libfuse source tree $LIBFUSE_SRC"
  elif [[ -f $LIBFUSE_SRC ]]; then from_tarball "$LIBFUSE_SRC" "libfuse release tarball $LIBFUSE_SRC"
  else die "LIBFUSE_SRC=$LIBFUSE_SRC: no such file or directory"
  fi
elif ! have_source || [[ $(cat "$SRC/VERSION" 2> /dev/null) != "$VERSION" ]]; then
  from_debian
fi
have_source || die "no source in $SRC"

read -ra fuse_flags <<< "$(pkg-config --cflags --libs fuse3)"
cmd=("$CXX" -O2 -std=c++17 -D_REENTRANT -Wall -Wno-sign-compare "$SRC/passthrough_hp.cc"
  "${fuse_flags[@]}" -pthread -o "$BIN.tmp")
stamp="libfuse $VERSION, source $(cat "$SRC/VERSION"); $(sha256sum "$SRC/passthrough_hp.cc" "$SRC/cxxopts.hpp" | cut -c1-64 | paste -sd' '); ${cmd[*]}; $(head -n 1 "$SRC/SOURCE")"
if [[ -x $BIN && -f $BIN.stamp && $(cat "$BIN.stamp") == "$stamp" ]]; then
  echo "$BIN"
  exit 0
fi
log "building $BIN from $(head -n 1 "$SRC/SOURCE")"
"${cmd[@]}" 2> "$DIR/build.log" || { cat "$DIR/build.log" >&2; die "the build failed (log: $DIR/build.log)"; }
mv -f "$BIN.tmp" "$BIN"
echo "$stamp" > "$BIN.stamp"
cp "$SRC/VERSION" "$DIR/VERSION"
echo "$BIN"
