import GatewayConfig
import HTTPProxy
import NIOHTTP1

/// `server.redirect_http_listen`: every plain-HTTP request gets a 308 (method and body kept) to
/// the same path on https. A pure rule.
///
/// The host of the `Location` is the request's when it is one the gateway serves (`public_url`'s
/// host, a route's `host`); any other `Host` goes to `public_url`, so the listener never sends a
/// client to a host an attacker named. Without `public_url` and without host routes, the
/// request's host is used (the gateway serves any host then). The port is `public_url`'s, else
/// `server.listen`'s unless it is 443. The target is kept when it is an origin-form path of
/// visible ASCII; anything else becomes `/`.
struct HTTPSRedirect: Sendable {
    /// `https://host[:port]` of `public_url`, if set.
    let fallback: String?
    /// Host names the gateway serves (lower case).
    let hosts: Set<String>
    /// The https port clients use; nil for 443.
    let port: Int?
    /// No host is named anywhere: any valid request host is one the gateway serves.
    let anyHost: Bool

    init(_ c: GatewayConfiguration) {
        var hosts = Set(c.routes.compactMap(\.host))
        var port: Int? = c.server.listen.port == 443 ? nil : c.server.listen.port
        var fallback: String? = nil
        if let url = c.server.publicURL {
            let authority = String(url.drop { $0 != "/" }.dropFirst(2))
            let address = ListenAddress.parse(authority)
            let host = (address?.host ?? authority).lowercased()
            hosts.insert(host)
            port = address.flatMap { $0.port == 443 ? nil : $0.port }
            fallback = "https://" + Self.authority(host, port)
        }
        self.init(fallback: fallback, hosts: hosts, port: port, anyHost: c.server.publicURL == nil && c.routes.allSatisfy { $0.host == nil })
    }

    init(fallback: String?, hosts: Set<String>, port: Int?, anyHost: Bool) {
        self.fallback = fallback
        self.hosts = hosts
        self.port = port
        self.anyHost = anyHost
    }

    /// Where to send the request; nil when no https URL can be made for it (400).
    func location(host: String?, target: String) -> String? {
        let path = target.hasPrefix("/") && !target.hasPrefix("//") && target.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) ? target : "/"
        if let host, case .success(let parsed) = RequestHost.parse(host) {
            let name = parsed.name.hasPrefix("[") ? String(parsed.name.dropFirst().dropLast()) : parsed.name
            if hosts.contains(name) || anyHost {
                return "https://" + Self.authority(name, port) + path
            }
        }
        return fallback.map { $0 + path }
    }

    func response(host: String?, target: String) -> SimpleResponse {
        guard let location = location(host: host, target: target) else {
            return SimpleResponse(status: .badRequest, "This listener redirects to https; the request has no usable Host.\n")
        }
        return SimpleResponse(status: .permanentRedirect, "Moved to \(location)\n", headers: [("location", location)])
    }

    private static func authority(_ host: String, _ port: Int?) -> String {
        let name = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        return port.map { "\(name):\($0)" } ?? name
    }
}
