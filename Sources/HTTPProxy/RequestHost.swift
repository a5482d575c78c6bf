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
    public let port: Int?
    /// `name[:port]`, as the upstream receives it in `Host`.
    public let authority: String
    /// UTF-8 length of the name at the start of `authority`.
    private let nameLength: Int

    /// Lower-case name without a trailing dot, or a bracketed IPv6 literal (`[::1]`). Made on
    /// demand (host routes, origin checks): most requests never need it apart from `authority`.
    public var name: String {
        port == nil ? authority : String(Substring(authority.utf8.prefix(nameLength)))
    }

    public init(name: String, port: Int? = nil) {
        self.port = port
        self.authority = port.map { "\(name):\($0)" } ?? name
        self.nameLength = name.utf8.count
    }

    private init(authority: String, nameLength: Int, port: Int?) {
        self.port = port
        self.authority = authority
        self.nameLength = nameLength
    }

    public static func == (a: RequestHost, b: RequestHost) -> Bool { a.authority == b.authority }
    public func hash(into hasher: inout Hasher) { hasher.combine(authority) }

    public enum Rejection: String, Error, Sendable {
        case emptyName = "empty host name"
        case emptyLabel = "empty label in host name"
        case badCharacter = "invalid character in host name"
        case badIPv6 = "malformed IPv6 literal"
        case badPort = "invalid port"
    }

    /// Parses a `Host` header value (or the authority of an absolute-form target). A value that
    /// is already in normal form (the common case) is kept as it is: no allocation.
    public static func parse(_ value: String) -> Result<RequestHost, Rejection> {
        let bytes = value.utf8
        var nameEnd = bytes.endIndex
        var port: Int? = nil
        if bytes.first == UInt8(ascii: "[") {
            guard let close = bytes.firstIndex(of: UInt8(ascii: "]")) else { return .failure(.badIPv6) }
            let inside = bytes[bytes.index(after: bytes.startIndex)..<close]
            guard !inside.isEmpty, inside.contains(UInt8(ascii: ":")),
                  inside.allSatisfy({ isHex($0) || $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: ".") }) else { return .failure(.badIPv6) }
            nameEnd = bytes.index(after: close)
            if nameEnd < bytes.endIndex {
                guard bytes[nameEnd] == UInt8(ascii: ":") else { return .failure(.badIPv6) }
                switch parsePort(bytes[bytes.index(after: nameEnd)...]) {
                case .success(let p): port = p
                case .failure(let r): return .failure(r)
                }
            }
            let name = bytes[..<nameEnd]
            let lowered = name.contains { $0 >= 0x41 && $0 <= 0x5a }
            return .success(normalized(value, name: name, lowered: lowered, droppedDot: false, port: port))
        }
        if let colon = bytes.firstIndex(of: UInt8(ascii: ":")) {
            nameEnd = colon
            switch parsePort(bytes[bytes.index(after: colon)...]) {
            case .success(let p): port = p
            case .failure(let r): return .failure(r)
            }
        }
        var name = bytes[..<nameEnd]
        let droppedDot = name.last == UInt8(ascii: ".")
        if droppedDot { name = name.dropLast() }
        guard !name.isEmpty else { return .failure(.emptyName) }
        var previous = UInt8(ascii: ".")
        var upper = false
        for b in name {
            if b == UInt8(ascii: ".") {
                if previous == UInt8(ascii: ".") { return .failure(.emptyLabel) }
            } else if b >= 0x41 && b <= 0x5a {
                upper = true
            } else if !isNameByte(b) {
                return .failure(.badCharacter)
            }
            previous = b
        }
        if previous == UInt8(ascii: ".") { return .failure(.emptyLabel) }
        return .success(normalized(value, name: name, lowered: upper, droppedDot: droppedDot, port: port))
    }

    /// The value itself when nothing changes; otherwise the lower-cased name and its authority.
    private static func normalized(_ value: String, name: Substring.UTF8View, lowered: Bool, droppedDot: Bool, port: Int?) -> RequestHost {
        if !lowered, !droppedDot { return RequestHost(authority: value, nameLength: name.count, port: port) }
        let lower = String(decoding: name.map { $0 >= 0x41 && $0 <= 0x5a ? $0 | 0x20 : $0 }, as: UTF8.self)
        return RequestHost(name: lower, port: port)
    }

    private static func parsePort(_ digits: Substring.UTF8View) -> Result<Int?, Rejection> {
        guard !digits.isEmpty, digits.count <= 5 else { return .failure(.badPort) }
        var port = 0
        for d in digits {
            guard d >= 0x30 && d <= 0x39 else { return .failure(.badPort) }
            port = port * 10 + Int(d - 0x30)
        }
        guard port >= 1, port <= 65535 else { return .failure(.badPort) }
        return .success(port)
    }

    private static func isNameByte(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x61 && b <= 0x7a) || b == UInt8(ascii: "-") || b == UInt8(ascii: "_")
    }

    private static func isHex(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66)
    }
}
