import GatewayConfig

/// The address a request came from, as far as the gateway can trust it: the peer, or — when the
/// peer is one of `server.trusted_proxies` — the nearest address in `X-Forwarded-For` that is not
/// itself a trusted proxy (entries further left are the client's own claims). Pure.
enum ClientAddress {
    static func isTrusted(_ address: String?, _ trusted: [CIDR]) -> Bool {
        address.flatMap(IPAddress.parse).map { ip in trusted.contains { $0.contains(ip) } } ?? false
    }

    static func resolve(peer: String?, forwardedFor: [String], trusted: [CIDR]) -> String {
        func isTrusted(_ text: String) -> Bool { Self.isTrusted(text, trusted) }
        guard let peer else { return "unknown" }
        guard isTrusted(peer) else { return peer }
        let hops = forwardedFor.flatMap { $0.split(separator: ",") }.map { $0.trimmingCharacters(in: .whitespaces) }
        for hop in hops.reversed() where IPAddress.parse(hop) != nil {
            if !isTrusted(hop) { return hop }
        }
        return peer
    }
}

extension ClientAddress {
    /// The key a per-client limit counts under: an IPv4 address as it is (an IPv4-mapped IPv6
    /// address as its IPv4 form), an IPv6 address by its /64 — one subscriber's network, in
    /// which every address is theirs to use.
    static func limitKey(_ address: String) -> String {
        guard let ip = IPAddress.parse(address) else { return address }
        let b = ip.bytes
        if b[0..<10].allSatisfy({ $0 == 0 }), b[10] == 0xff, b[11] == 0xff {
            return b[12...].map { String($0) }.joined(separator: ".")
        }
        guard ip.isV6 else { return address }
        let groups = stride(from: 0, to: 8, by: 2).map { String(UInt16(b[$0]) << 8 | UInt16(b[$0 + 1]), radix: 16) }
        return groups.joined(separator: ":") + "::/64"
    }
}
