/// The request target, parsed once into the canonical path that routing, the guard's policy and
/// the upstream all use (`docs/security.md`, *Request target and routing*).
///
/// Canonical form: origin-form; unreserved percent-escapes decoded (`%2e` → `.`, `%41` → `A`);
/// other escapes upper-cased; dot segments resolved (RFC 3986 §5.2.4); runs of `/` merged;
/// printable characters outside RFC 3986 `pchar` percent-encoded. Rejected (400): encoded `/`,
/// `\`, `#`, `;`, `?` or NUL; a raw `\`, `#` or `;`; control characters, raw or encoded; malformed escapes; asterisk,
/// authority and opaque forms; an absolute-form target whose authority differs from `Host`.
public struct RequestTarget: Sendable, Equatable {
    /// Canonical path, always starting with `/`.
    public var path: String
    /// The raw query without `?`, forwarded unchanged; `nil` when there is none. Policy never looks at it.
    public var query: String?

    public init(path: String, query: String?) {
        self.path = path
        self.query = query
    }

    /// What the upstream receives as its request target.
    public var forwarded: String { query.map { "\(path)?\($0)" } ?? path }

    public enum Rejection: String, Error, Sendable {
        case notOriginForm = "request target must be a path"
        case foreignAuthority = "absolute-form target names another host"
        case encodedSeparator = "encoded '/', '\\\\', '#' or NUL in path"
        /// `%3B` and `%3F`: an app that decodes before splitting sees `;` parameters or a query
        /// that routing did not (`/admin%3Bx` is `/admin` to a Tomcat, `/admin;x` to routing).
        case encodedDelimiter = "encoded ';' or '?' in path"
        case backslash = "'\\\\' in path"
        case fragment = "'#' in request target"
        case semicolon = "';' parameters in path"
        case controlCharacter = "control character in request target"
        case badEscape = "malformed percent-escape"
    }

    /// Parses `uri` from the request line. `host` is the request's normalized `Host` (for
    /// absolute-form, whose authority must normalize to the same host and port).
    public static func parse(_ uri: String, host: RequestHost?) -> Result<RequestTarget, Rejection> {
        var utf8 = Substring(uri).utf8
        if utf8.first != UInt8(ascii: "/") {
            // absolute-form: only http(s)://authority/... naming our own Host.
            let lower = uri.prefix(8).lowercased()
            let schemeLength: Int
            if lower.hasPrefix("http://") { schemeLength = 7 } else if lower.hasPrefix("https://") { schemeLength = 8 } else { return .failure(.notOriginForm) }
            let afterScheme = Substring(uri).utf8.dropFirst(schemeLength)
            let slash = afterScheme.firstIndex(where: { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") }) ?? afterScheme.endIndex
            let authority = Substring(afterScheme[afterScheme.startIndex..<slash])
            guard let host, case .success(let named) = RequestHost.parse(String(authority)), named == host else { return .failure(.foreignAuthority) }
            utf8 = afterScheme[slash...]
            if utf8.first != UInt8(ascii: "/") {
                if utf8.isEmpty { return .success(RequestTarget(path: "/", query: nil)) }
                if utf8.first == UInt8(ascii: "#") { return .failure(.fragment) }
                // "http://host?q" → path "/" with the query
                let rest = String(Substring(utf8))
                return canonicalize(Substring("/" + rest).utf8)
            }
        }
        return canonicalize(utf8)
    }

    private static func canonicalize(_ bytes: Substring.UTF8View) -> Result<RequestTarget, Rejection> {
        let queryStart = bytes.firstIndex(of: UInt8(ascii: "?"))
        let pathBytes = bytes[bytes.startIndex..<(queryStart ?? bytes.endIndex)]
        var query: String? = nil
        if let queryStart {
            let q = bytes[bytes.index(after: queryStart)...]
            for b in q {
                if b == UInt8(ascii: "#") { return .failure(.fragment) }
                if b < 0x21 || b == 0x7f { return .failure(.controlCharacter) }
            }
            query = String(Substring(q))
        }
        // Fast path: already canonical (the common case) → no rewriting.
        var needsWork = false
        var previous: UInt8 = 0
        for b in pathBytes {
            switch Self.byteClass[Int(b)] {
            case .plain: break
            case .slash: if previous == UInt8(ascii: "/") { needsWork = true }
            case .dot: if previous == UInt8(ascii: "/") || previous == UInt8(ascii: ".") { needsWork = true }
            case .special: needsWork = true
            case .reject(let r): return .failure(r)
            }
            previous = b
        }
        if !needsWork && previous != UInt8(ascii: ".") {
            return .success(RequestTarget(path: String(Substring(pathBytes)), query: query))
        }
        // Slow path: decode unreserved escapes, encode what must be, then split into segments.
        var decoded: [UInt8] = []
        decoded.reserveCapacity(pathBytes.count)
        var i = pathBytes.startIndex
        while i < pathBytes.endIndex {
            let b = pathBytes[i]
            if b == UInt8(ascii: "%") {
                let h1 = pathBytes.index(after: i)
                guard h1 < pathBytes.endIndex else { return .failure(.badEscape) }
                let h2 = pathBytes.index(after: h1)
                guard h2 < pathBytes.endIndex, let hi = hexValue(pathBytes[h1]), let lo = hexValue(pathBytes[h2]) else { return .failure(.badEscape) }
                let value = hi << 4 | lo
                if value == UInt8(ascii: "/") || value == UInt8(ascii: "\\") || value == UInt8(ascii: "#") || value == 0 {
                    return .failure(.encodedSeparator)
                }
                if value == UInt8(ascii: ";") || value == UInt8(ascii: "?") { return .failure(.encodedDelimiter) }
                // An encoded control character is one to an app that decodes (`/admin%09`).
                if value < 0x20 || value == 0x7f { return .failure(.controlCharacter) }
                if isUnreserved(value) { decoded.append(value) } else { appendEscape(value, to: &decoded) }
                i = pathBytes.index(after: h2)
                continue
            }
            switch Self.byteClass[Int(b)] {
            case .reject(let r): return .failure(r)
            case .special: appendEscape(b, to: &decoded)
            case .plain, .slash, .dot: decoded.append(b)
            }
            i = pathBytes.index(after: i)
        }
        // Resolve dot segments and merge empty segments.
        var output: [ArraySlice<UInt8>] = []
        let segments = decoded.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true)
        for segment in segments {
            if segment.elementsEqual([UInt8(ascii: ".")]) { continue }
            if segment.elementsEqual([UInt8(ascii: "."), UInt8(ascii: ".")]) { _ = output.popLast(); continue }
            output.append(segment)
        }
        var path: [UInt8] = []
        path.reserveCapacity(decoded.count)
        for segment in output {
            path.append(UInt8(ascii: "/"))
            path.append(contentsOf: segment)
        }
        let last = decoded.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true).last
        let endsWithDirectory = decoded.last == UInt8(ascii: "/") || last.map { $0.elementsEqual([UInt8(ascii: ".")]) || $0.elementsEqual([UInt8(ascii: "."), UInt8(ascii: ".")]) } ?? false
        if path.isEmpty || endsWithDirectory { path.append(UInt8(ascii: "/")) }
        return .success(RequestTarget(path: String(decoding: path, as: UTF8.self), query: query))
    }

    private enum ByteClass {
        case plain, slash, dot, special
        case reject(Rejection)
    }

    private static let byteClass: [ByteClass] = (0..<256).map { i in
        let b = UInt8(i)
        if b < 0x20 || b == 0x7f || b == 0x20 { return .reject(.controlCharacter) }
        if b == UInt8(ascii: "/") { return .slash }
        if b == UInt8(ascii: ".") { return .dot }
        if b == UInt8(ascii: "\\") { return .reject(.backslash) }
        if b == UInt8(ascii: "#") { return .reject(.fragment) }
        if b == UInt8(ascii: ";") { return .reject(.semicolon) }
        if isUnreserved(b) { return .plain }
        if "!$&'()*+,=:@".utf8.contains(b) { return .plain }
        return .special  // '%' and bytes to percent-encode
    }

    private static func isUnreserved(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || b == UInt8(ascii: "-") || b == UInt8(ascii: ".") || b == UInt8(ascii: "_") || b == UInt8(ascii: "~")
    }

    /// A hex digit's value: `0-9`, `A-F`, `a-f` only (`UInt8(_:radix:)` also takes a sign).
    static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case 0x30...0x39: return b - 0x30
        case 0x41...0x46: return b - 0x37
        case 0x61...0x66: return b - 0x57
        default: return nil
        }
    }

    private static func appendEscape(_ b: UInt8, to out: inout [UInt8]) {
        let hex = Array("0123456789ABCDEF".utf8)
        out.append(UInt8(ascii: "%"))
        out.append(hex[Int(b >> 4)])
        out.append(hex[Int(b & 0xf)])
    }
}
