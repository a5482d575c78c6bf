#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `host:port` or `[v6]:port`, as `server.listen` and `server.admin_listen` write it.
public struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public static func parse(_ text: String) -> ListenAddress? {
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            host = text[text.index(after: text.startIndex)..<close]
            let rest = text[text.index(after: close)...]
            guard rest.hasPrefix(":") else { return nil }
            portText = rest.dropFirst()
            guard IPAddress.parse(String(host))?.isV6 == true else { return nil }
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
            guard !host.isEmpty, !host.contains(":") else { return nil }
            guard host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-") }) else { return nil }
        }
        guard let port = Int(portText), (0...65535).contains(port) else { return nil }
        return ListenAddress(host: String(host), port: port)
    }

    public var isLoopback: Bool {
        if host == "localhost" { return true }
        guard let ip = IPAddress.parse(host) else { return false }
        return CIDR.loopback.contains { $0.contains(ip) }
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// An IPv4 or IPv6 address as 16 bytes (IPv4 mapped into `::ffff:0:0/96`).
public struct IPAddress: Sendable, Hashable {
    public var bytes: [UInt8]
    public var isV6: Bool

    public static func parse(_ text: String) -> IPAddress? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            let b = withUnsafeBytes(of: v4) { Array($0) }
            return IPAddress(bytes: Array(repeating: 0, count: 10) + [0xff, 0xff] + b, isV6: false)
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 {
            return IPAddress(bytes: withUnsafeBytes(of: v6) { Array($0) }, isV6: true)
        }
        return nil
    }

    init(bytes: [UInt8], isV6: Bool) {
        self.bytes = bytes
        self.isV6 = isV6
    }
}

/// A network in CIDR notation (`10.0.0.0/8`, `::1/128`); a bare address means a single host.
public struct CIDR: Sendable, Equatable, CustomStringConvertible {
    public var network: IPAddress
    /// Prefix length counted over the 128-bit (mapped) form.
    public var prefixLength: Int
    public let description: String

    public static let loopback: [CIDR] = [CIDR.parse("127.0.0.0/8")!, CIDR.parse("::1/128")!]

    public static func parse(_ text: String) -> CIDR? {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count <= 2, let address = IPAddress.parse(String(parts[0])) else { return nil }
        let maxBits = address.isV6 ? 128 : 32
        var bits = maxBits
        if parts.count == 2 {
            guard !parts[1].isEmpty, parts[1].allSatisfy(\.isNumber), let b = Int(parts[1]), b <= maxBits else { return nil }
            bits = b
        }
        let length = address.isV6 ? bits : bits + 96
        var network = address
        for i in 0..<16 {
            let keep = max(0, min(8, length - i * 8))
            network.bytes[i] &= keep == 0 ? 0 : UInt8(truncatingIfNeeded: 0xff << (8 - keep))
        }
        return CIDR(network: network, prefixLength: length, description: text)
    }

    public func contains(_ address: IPAddress) -> Bool {
        for i in 0..<16 {
            let keep = max(0, min(8, prefixLength - i * 8))
            if keep == 0 { return true }
            let mask = UInt8(truncatingIfNeeded: 0xff << (8 - keep))
            if address.bytes[i] & mask != network.bytes[i] { return false }
        }
        return true
    }

    public static func == (a: CIDR, b: CIDR) -> Bool { a.network == b.network && a.prefixLength == b.prefixLength }
}

/// An upstream origin: `http://host[:port]` or `https://host[:port]` (ports 80 and 443 by default).
public struct UpstreamURL: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var tls: Bool

    public init(host: String, port: Int, tls: Bool = false) {
        self.host = host
        self.port = port
        self.tls = tls
    }

    public enum ParseError: Error, Equatable { case scheme, authority, path }

    public static func parse(_ text: String) -> Result<UpstreamURL, ParseError> {
        let tls: Bool
        var rest: Substring
        if text.hasPrefix("http://") { tls = false; rest = Substring(text.dropFirst("http://".count)) }
        else if text.hasPrefix("https://") { tls = true; rest = Substring(text.dropFirst("https://".count)) }
        else { return .failure(.scheme) }
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        if rest.contains("/") || rest.contains("?") || rest.contains("#") { return .failure(.path) }
        if rest.contains("@") { return .failure(.authority) }
        if let address = ListenAddress.parse(String(rest)) {
            guard address.port > 0 else { return .failure(.authority) }
            return .success(UpstreamURL(host: address.host, port: address.port, tls: tls))
        }
        guard !rest.isEmpty, !rest.contains(":"), !rest.contains("[") else { return .failure(.authority) }
        guard ListenAddress.parse(String(rest) + ":80") != nil else { return .failure(.authority) }
        return .success(UpstreamURL(host: String(rest), port: tls ? 443 : 80, tls: tls))
    }

    public var description: String { "\(tls ? "https" : "http")://\(host.contains(":") ? "[\(host)]" : host):\(port)" }
}
