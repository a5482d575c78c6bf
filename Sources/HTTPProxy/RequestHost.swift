/// The request's host, normalized once: routing, the absolute-form check, `X-Forwarded-Host`,
/// the upstream's `Host` and the origin checks all use this one value (`docs/security.md`,
/// *Request target and routing*: the check and the backend must see the same host).
///
/// Normal form: the name lower-cased with one trailing dot removed (`Secure.Example.TEST.` →
/// `secure.example.test`); an IPv6 literal keeps its brackets; a port, when present, is 1–5
/// digits up to 65535. Rejected (400): an empty name or label (`.`, `a..b`, `.a`), characters
/// outside letters, digits, `-`, `_` and `.` in a name, a malformed IPv6 literal, more than one
/// `:` outside brackets, an empty or non-numeric port.
public struct RequestHost: Sendable, Hashable {
    /// Lower-case name without a trailing dot, or a bracketed IPv6 literal (`[::1]`).
    public var name: String
    public var port: Int?

    public init(name: String, port: Int? = nil) {
        self.name = name
        self.port = port
    }

    /// `name[:port]`, as the upstream receives it in `Host`.
    public var authority: String { port.map { "\(name):\($0)" } ?? name }

    public enum Rejection: String, Error, Sendable {
        case emptyName = "empty host name"
        case emptyLabel = "empty label in host name"
        case badCharacter = "invalid character in host name"
        case badIPv6 = "malformed IPv6 literal"
        case badPort = "invalid port"
    }

    /// Parses a `Host` header value (or the authority of an absolute-form target).
    public static func parse(_ value: String) -> Result<RequestHost, Rejection> {
        let bytes = Array(value.utf8)
        var nameEnd = bytes.count
        var portStart: Int? = nil
        if bytes.first == UInt8(ascii: "[") {
            guard let close = bytes.firstIndex(of: UInt8(ascii: "]")), close > 1 else { return .failure(.badIPv6) }
            let inside = bytes[1..<close]
            guard inside.contains(UInt8(ascii: ":")), inside.allSatisfy({ isHex($0) || $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: ".") }) else {
                return .failure(.badIPv6)
            }
            nameEnd = close + 1
            if nameEnd < bytes.count {
                guard bytes[nameEnd] == UInt8(ascii: ":") else { return .failure(.badIPv6) }
                portStart = nameEnd + 1
            }
            let port: Int?
            switch parsePort(bytes, from: portStart) {
            case .success(let p): port = p
            case .failure(let r): return .failure(r)
            }
            return .success(RequestHost(name: String(decoding: bytes[0..<nameEnd], as: UTF8.self).lowercased(), port: port))
        }
        if let colon = bytes.firstIndex(of: UInt8(ascii: ":")) {
            nameEnd = colon
            portStart = colon + 1
        }
        var name = bytes[0..<nameEnd]
        if name.last == UInt8(ascii: ".") { name = name.dropLast() }
        guard !name.isEmpty else { return .failure(.emptyName) }
        if name.last == UInt8(ascii: ".") { return .failure(.emptyLabel) }
        var previous = UInt8(ascii: ".")
        for b in name {
            if b == UInt8(ascii: ".") {
                if previous == UInt8(ascii: ".") { return .failure(.emptyLabel) }
            } else if !isNameByte(b) {
                return .failure(.badCharacter)
            }
            previous = b
        }
        let port: Int?
        switch parsePort(bytes, from: portStart) {
        case .success(let p): port = p
        case .failure(let r): return .failure(r)
        }
        let lower = name.contains { $0 >= 0x41 && $0 <= 0x5a } ? name.map { $0 >= 0x41 && $0 <= 0x5a ? $0 | 0x20 : $0 } : Array(name)
        return .success(RequestHost(name: String(decoding: lower, as: UTF8.self), port: port))
    }

    private static func parsePort(_ bytes: [UInt8], from start: Int?) -> Result<Int?, Rejection> {
        guard let start else { return .success(nil) }
        let digits = bytes[start...]
        guard !digits.isEmpty, digits.count <= 5, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return .failure(.badPort) }
        let port = digits.reduce(0) { $0 * 10 + Int($1 - 0x30) }
        guard port >= 1, port <= 65535 else { return .failure(.badPort) }
        return .success(port)
    }

    private static func isNameByte(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || b == UInt8(ascii: "-") || b == UInt8(ascii: "_")
    }

    private static func isHex(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66)
    }
}
