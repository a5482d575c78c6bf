import GatewayConfig
import Testing

@testable import Gateway

/// `server.redirect_http_listen`'s rule as a table: which host and port the 308 names, and
/// what becomes of the target.
@Suite("HTTPS redirect rule")
struct HTTPSRedirectTests {
    static func configuration(publicURL: String?, listen: Int = 443, routeHosts: [String?] = [nil]) -> GatewayConfiguration {
        var c = GatewayConfiguration()
        c.server.publicURL = publicURL
        c.server.listen = ListenAddress(host: "0.0.0.0", port: listen)
        c.routes = routeHosts.enumerated().map { i, host in
            .init(name: "r\(i)", host: host, pathPrefix: "/p\(i)/", upstream: UpstreamURL(host: "127.0.0.1", port: 9000), auth: .public)
        }
        return c
    }

    @Test("Location for each Host and target", arguments: [
        // (public_url, listen port, route hosts, Host, target, Location)
        ("https://app.example.com", 443, [nil], "app.example.com", "/a?b=1", "https://app.example.com/a?b=1"),
        ("https://app.example.com", 443, [nil], "APP.example.com.:80", "/a", "https://app.example.com/a"),
        ("https://app.example.com", 443, [nil], "evil.example", "/a", "https://app.example.com/a"),
        ("https://app.example.com", 443, [nil], nil, "/a", "https://app.example.com/a"),
        ("https://app.example.com", 443, ["api.example.com"], "api.example.com", "/v1", "https://api.example.com/v1"),
        ("https://app.example.com:8443", 8443, [nil], "app.example.com:8080", "/x", "https://app.example.com:8443/x"),
        ("https://app.example.com", 443, [nil], "app.example.com", "//evil.example/x", "https://app.example.com/"),
        ("https://app.example.com", 443, [nil], "app.example.com", "http://evil.example/x", "https://app.example.com/"),
        ("https://app.example.com", 443, [nil], "app.example.com", "*", "https://app.example.com/"),
        (nil, 8443, [nil], "any.example:80", "/x", "https://any.example:8443/x"),
        (nil, 443, ["only.example"], "other.example", "/x", nil),
        ("https://[::1]:8443", 8443, [nil], "[::1]:8080", "/x", "https://[::1]:8443/x"),
    ] as [(String?, Int, [String?], String?, String, String?)])
    func location(publicURL: String?, listen: Int, routeHosts: [String?], host: String?, target: String, expected: String?) {
        let rule = HTTPSRedirect(Self.configuration(publicURL: publicURL, listen: listen, routeHosts: routeHosts))
        #expect(rule.location(host: host, target: target) == expected)
    }

    @Test("the response is a 308 with Location, or a 400 when no https URL can be made")
    func response() {
        let rule = HTTPSRedirect(Self.configuration(publicURL: nil, routeHosts: ["only.example"]))
        #expect(rule.response(host: "only.example", target: "/x").status == .permanentRedirect)
        #expect(rule.response(host: "only.example", target: "/x").headers.contains { $0 == ("location", "https://only.example/x") })
        #expect(rule.response(host: "other.example", target: "/x").status == .badRequest)
    }
}
