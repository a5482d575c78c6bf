import Foundation
import HTTPProxy
import TestSupport
import Testing

/// HTTP/1.0 clients on raw sockets: a connection stays open only when the response says
/// `Connection: keep-alive` — the gateway's own answers (here a 404) as much as the app's.
@Suite("HTTP/1.0 keep-alive (raw sockets)", .serialized, .timeLimit(.minutes(3)))
struct HTTP10KeepAliveTests {
    static func appOnly(_ upstream: UpstreamAddress) -> [ProxyRoute] {
        [ProxyRoute(name: "app", pathPrefix: "/app", upstream: upstream)]
    }

    @Test("asked for keep-alive: the gateway's 404 says keep-alive, and the connection serves a 404 and a relayed response after it")
    func keepAlive() async throws {
        try await ProxyHarness.with(routes: Self.appOnly) { h in
            let port = h.port
            let (responses, closedEarly) = try await blocking { () -> ([RawClient.Response], Bool) in
                let client = try RawClient(port: port, timeoutSeconds: 2)
                var responses: [RawClient.Response] = []
                for path in ["/nowhere", "/nowhere/else", "/app/echo"] {
                    guard (try? client.send("GET \(path) HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")) != nil,
                          let response = try? client.readResponse() else { return (responses, true) }
                    responses.append(response)
                }
                // Still open: the receive timeout passes without a FIN.
                return (responses, client.waitForClose())
            }
            #expect(responses.map(\.status) == [404, 404, 200])
            #expect(responses.map { $0.header("connection")?.lowercased() } == ["keep-alive", "keep-alive", "keep-alive"])
            #expect(!closedEarly)
        }
    }

    @Test("not asked: the gateway's 404 says close, and the connection closes")
    func close() async throws {
        try await ProxyHarness.with(routes: Self.appOnly) { h in
            let port = h.port
            let (response, closed) = try await blocking { () -> (RawClient.Response, Bool) in
                let client = try RawClient(port: port, timeoutSeconds: 2)
                try client.send("GET /nowhere HTTP/1.0\r\n\r\n")
                return (try client.readResponse(), client.waitForClose())
            }
            #expect(response.status == 404)
            #expect(response.header("connection")?.lowercased() == "close")
            #expect(closed)
        }
    }
}
