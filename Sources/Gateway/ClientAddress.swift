import GatewayConfig

/// The address a request came from, as far as the gateway can trust it: the peer, or — when the
/// peer is one of `server.trusted_proxies` — the nearest address in `X-Forwarded-For` that is not
/// itself a trusted proxy (entries further left are the client's own claims). Pure.
enum ClientAddress {
    static func resolve(peer: String?, forwardedFor: [String], trusted: [CIDR]) -> String {
        func isTrusted(_ text: String) -> Bool { IPAddress.parse(text).map { ip in trusted.contains { $0.contains(ip) } } ?? false }
        guard let peer else { return "unknown" }
        guard isTrusted(peer) else { return peer }
        let hops = forwardedFor.flatMap { $0.split(separator: ",") }.map { $0.trimmingCharacters(in: .whitespaces) }
        for hop in hops.reversed() where IPAddress.parse(hop) != nil {
            if !isTrusted(hop) { return hop }
        }
        return peer
    }
}
