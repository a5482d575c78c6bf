import Foundation
import GatewayConfig
import HTTPProxy
import NIOHTTP1
import Testing

@testable import Gateway

/// CORS preflights on guarded routes (issue 28 §2): by the Fetch standard they carry no cookies,
/// so `preflight: pass` forwards them to the app without a session.
@Suite("CORS preflights")
struct PreflightTests {
    @Test("what counts as a preflight", arguments: [
        (HTTPMethod.OPTIONS, true, true, true),
        (.OPTIONS, false, true, false),  // no Origin: not from a browser's fetch
        (.OPTIONS, true, false, false),  // no Access-Control-Request-Method: a plain OPTIONS
        (.GET, true, true, false),
        (.POST, true, true, false),
    ])
    func isPreflight(method: HTTPMethod, origin: Bool, requestMethod: Bool, expected: Bool) {
        var headers = HTTPHeaders()
        if origin { headers.add(name: "Origin", value: "https://other.example.com") }
        if requestMethod { headers.add(name: "Access-Control-Request-Method", value: "PUT") }
        let request = GuardRequest(head: HTTPRequestHead(version: .http1_1, method: method, uri: "/api/x", headers: headers),
                                   target: RequestTarget(path: "/api/x", query: nil), routeName: "api")
        #expect(request.isPreflight == expected)
    }

    @Test("preflight: pass forwards a preflight without a session and without identity; the request after it still needs one")
    func passedToTheApp() async throws {
        try await SignInHarness.with(configure: { c in c.routes[0].preflight = .pass }) { h in
            let anonymous = TestBrowser(gatewayOrigin: h.origin)
            let preflight: [(String, String)] = [("origin", "https://spa.example.com"), ("access-control-request-method", "PUT"), ("x-auth-user", "forged")]
            let passed = try await anonymous.request("/api/items", method: .OPTIONS, headers: preflight)
            #expect(passed.status == 200, "the app answered it")
            let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
            #expect(seen["access-control-request-method"] == ["PUT"])
            #expect(seen["x-auth-user"].isEmpty, "identity headers are stripped as on every forwarded request")
            #expect(try await anonymous.request("/api/items", method: .OPTIONS, headers: [("origin", "https://spa.example.com")]).status == 401,
                    "a plain OPTIONS is not a preflight")
            #expect(try await anonymous.request("/api/items", method: .PUT, headers: [("origin", "https://spa.example.com")]).status == 401)
            // Without the key, a preflight is a request without a session.
            #expect(try await anonymous.request("/x", method: .OPTIONS, headers: preflight).status == 401)
        }
    }

    @Test("preflight: pass on a public route is an error at its key")
    func publicRoute() {
        let result = GatewayConfiguration.parse(yaml: """
            routes:
              - name: a
                upstream: "http://127.0.0.1:9000"
                auth: public
                preflight: pass
            """)
        #expect(result.problems.contains { $0.path == "routes[0].preflight" && $0.line == 5 && $0.message.contains("no effect on a public route") },
                "\(result.problems)")
    }
}
