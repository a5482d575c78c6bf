import Testing

@testable import HTTPProxy

/// What the upstream's request line says for a route (`strip_prefix`).
@Suite("Route targets")
struct RouteTargetTests {
    @Test("strip_prefix removes the route's prefix and keeps a leading slash and the query", arguments: [
        // (prefix, strip, path, query, upstream target)
        ("/static/", true, "/static/index.html", nil, "/index.html"),
        ("/static/", true, "/static/", nil, "/"),
        ("/static", true, "/static", nil, "/"),
        ("/static", true, "/static/a/b", "x=1", "/a/b?x=1"),
        ("/static", true, "/staticx", nil, "/staticx"),
        ("/", true, "/a", nil, "/a"),
        ("/static/", false, "/static/index.html", "q", "/static/index.html?q"),
        ("/api/v1", true, "/api/v1/users", nil, "/users"),
    ] as [(String, Bool, String, String?, String)])
    func stripPrefix(prefix: String, strip: Bool, path: String, query: String?, expected: String) throws {
        let route = ProxyRoute(name: "r", pathPrefix: prefix, upstream: UpstreamAddress(host: "127.0.0.1", port: 1), stripPrefix: strip)
        #expect(route.upstreamTarget(RequestTarget(path: path, query: query)) == expected)
    }
}
