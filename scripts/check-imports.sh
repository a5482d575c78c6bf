#!/usr/bin/env bash
# Checks that Package.swift declares exactly what each target imports: every target's
# `dependencies` must be the set of modules its Swift files `import` (our targets by name,
# packages' products by module name), no more and no less, test targets included. A module
# that compiles only because another dependency imports it (a transitive import) is reported,
# and so is a dependency no file uses. Modules of the toolchain are exempt. Our own modules
# import each other only along the graph below (README "Development"), so that the CLI and the
# data path cannot drift from it: a product target that declares one of ours outside it fails.
#
# Usage: scripts/check-imports.sh   (from anywhere; exit status 1 on any difference)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - <<'PY'
import os, re, sys

# The toolchain's own modules: never declared in Package.swift.
EXEMPT = {"Swift", "_Concurrency", "Synchronization", "Foundation", "FoundationEssentials", "FoundationNetworking",
          "Dispatch", "Glibc", "Musl", "Darwin", "XCTest", "Testing"}
# Each product this package uses, by module name, and the package that provides it.
PRODUCTS = {
    "NIOCore": "swift-nio", "NIOPosix": "swift-nio", "NIOHTTP1": "swift-nio", "NIOConcurrencyHelpers": "swift-nio",
    "NIOEmbedded": "swift-nio", "NIOTLS": "swift-nio", "NIOFoundationCompat": "swift-nio",
    "NIOExtras": "swift-nio-extras", "NIOSSL": "swift-nio-ssl", "Logging": "swift-log", "Prometheus": "swift-prometheus",
    "ServiceLifecycle": "swift-service-lifecycle", "UnixSignals": "swift-service-lifecycle",
    "ArgumentParser": "swift-argument-parser", "Yams": "Yams", "Crypto": "swift-crypto", "_CryptoExtras": "swift-crypto",
    "AsyncHTTPClient": "async-http-client", "NIOHTTP2": "swift-nio-http2", "NIOHPACK": "swift-nio-http2",
}

# Which of our modules each product target may import (test targets may import any).
ALLOWED = {
    "CHiredis": set(),            # the system's hiredis: linked by the tests only (the RESP oracle)
    "Redis": set(),               # its own RESP reader and writer on NIO
    "Sessions": {"Redis"},
    "AppleID": set(),             # the relying party: no session state
    "AppleIDSimulator": set(),    # never AppleID (the two check each other), nor HTTPProxy
    "GatewayConfig": set(),
    "HTTPProxy": {"GatewayConfig"},  # knows nothing of Apple or sessions
    "Gateway": {"Sessions", "AppleID", "HTTPProxy", "GatewayConfig"},
    "sessiongate": {"Gateway", "AppleIDSimulator"},  # the CLI: thin
}

def balanced(text, start, open_, close):
    """The text between text[start] == open_ and its matching close (strings respected)."""
    depth, i, in_string = 0, start, False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\": i += 1
            elif c == '"': in_string = False
        elif c == '"': in_string = True
        elif c == open_: depth += 1
        elif c == close:
            depth -= 1
            if depth == 0: return text[start + 1:i]
        i += 1
    sys.exit("check-imports: unbalanced %s in Package.swift" % open_)

manifest = re.sub(r"//[^\n]*", "", open("Package.swift").read())
targets = []  # (name, directory, {module: package or None})
for m in re.finditer(r"\.(target|executableTarget|testTarget|systemLibrary)\(", manifest):
    args = balanced(manifest, m.end() - 1, "(", ")")
    name = re.search(r'name:\s*"([^"]+)"', args).group(1)
    if m.group(1) == "systemLibrary": continue
    if any(t[0] == name for t in targets): continue  # a `.target(name:)` inside dependencies
    path = re.search(r'\bpath:\s*"([^"]+)"', args)
    directory = path.group(1) if path else ("Tests/" if m.group(1) == "testTarget" else "Sources/") + name
    declared = {}
    deps = re.search(r"\bdependencies:\s*\[", args)
    if deps:
        text = balanced(args, deps.end() - 1, "[", "]")
        for p in re.finditer(r'\.product\(\s*name:\s*"([^"]+)"\s*,\s*package:\s*"([^"]+)"\s*\)', text):
            declared[p.group(1)] = p.group(2)
        text = re.sub(r"\.product\([^)]*\)", "", text)
        for t in re.findall(r'"([^"]+)"', text):
            declared[t] = None
    targets.append((name, directory, declared))

IMPORT = re.compile(r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|package|internal|fileprivate|private)\s+)?import\s+"
                    r"(?:(?:typealias|struct|class|enum|protocol|let|var|func)\s+)?([A-Za-z_]\w*)")
names = {t[0] for t in targets} | {m.group(1) for m in re.finditer(r'\.systemLibrary\(\s*name:\s*"([^"]+)"', manifest)}
problems = []
for name, directory, declared in targets:
    if not directory.startswith("Tests"):
        if name not in ALLOWED:
            problems.append("%s: not in the import graph (ALLOWED in scripts/check-imports.sh, README \"Development\")" % name)
        for module in sorted(m for m in declared if m in names and m not in ALLOWED.get(name, set())):
            problems.append("%s: imports %s, which the import graph does not allow (it may import: %s)"
                            % (name, module, ", ".join(sorted(ALLOWED.get(name, set()))) or "none of ours"))
    imported = {}  # module -> first file:line
    for root, _, files in sorted(os.walk(directory)):
        for f in sorted(files):
            if not f.endswith(".swift"): continue
            path = os.path.join(root, f)
            # Multi-line string literals and block comments can hold an `import` line (a
            # Python script in a test): blanked, keeping the line numbers.
            source = re.sub(r'(#*)"""[\s\S]*?"""\1|^[ \t]*/\*[\s\S]*?\*/', lambda m: "\n" * m.group(0).count("\n"), open(path, encoding="utf-8").read(), flags=re.M)
            for number, line in enumerate(source.split("\n"), 1):
                m = IMPORT.match(line)
                if m and m.group(1) not in EXEMPT and m.group(1) not in imported:
                    imported[m.group(1)] = "%s:%d" % (path, number)
    for module in sorted(set(imported) - set(declared)):
        if module in names:
            how = '"%s"' % module
        elif module in PRODUCTS:
            how = '.product(name: "%s", package: "%s")' % (module, PRODUCTS[module])
        else:
            how = "an unknown module: add its package to the list in scripts/check-imports.sh"
        problems.append("%s: imports %s (%s) without declaring it: %s" % (name, module, imported[module], how))
    for module in sorted(set(declared) - set(imported)):
        problems.append("%s: declares %s, which none of its files imports" % (name, module))
    for module, package in sorted(declared.items()):
        if package is not None and PRODUCTS.get(module, package) != package:
            problems.append('%s: declares %s from package "%s"; it comes from "%s"' % (name, module, package, PRODUCTS[module]))
        if package is None and module not in names:
            problems.append("%s: declares %s, which is not a target of this package" % (name, module))

for p in problems: print("check-imports: " + p)
if problems: sys.exit(1)
print("check-imports: %d targets, each declares exactly what it imports, along the import graph" % len(targets))
PY
