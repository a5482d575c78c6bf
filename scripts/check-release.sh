#!/bin/sh
# Proves a release binary runs without the Swift toolchain: nothing it links dynamically comes
# from the toolchain (libswift*, Foundation, Dispatch), and it starts with the toolchain's
# library directories out of reach. Usage: scripts/check-release.sh [BINARY]
set -eu
bin=${1:-.build/release/sessiongate}
libs=$(ldd "$bin")
echo "$bin links dynamically:"
echo "$libs" | awk '{print "  " $1}'
if echo "$libs" | grep -Eq 'libswift|libFoundation|libdispatch|libBlocksRuntime|/swift/|not found'; then
    echo "error: $bin needs the Swift toolchain at run time" >&2
    exit 1
fi
env -i "$bin" --version
