import GatewayConfig
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// An HTTP/1.0 client assumes the connection closes after a response unless the response says
/// `Connection: keep-alive` (RFC 9112 §9.3, RFC 1945 as extended): the gateway says it whenever
/// it keeps such a connection open, for its own answers as for relayed ones.
@Suite("Client connection: HTTP/1.0 keep-alive, on EmbeddedChannels")
struct HTTP10KeepAliveHandlerTests {
    @Test("the gateway's own answer to an HTTP/1.0 client", arguments: [
        ("asked for keep-alive", "Connection: keep-alive\r\n", "connection: keep-alive\r\n", true),
        ("did not ask", "", "connection: close\r\n", false),
    ])
    func localAnswer(_ name: String, field: String, says: String, staysOpen: Bool) throws {
        let f = try ClientConnectionTests().makeFixture(ScriptedGuard { _, _ in .verdict(.respond(.error(.forbidden, "no"))) })
        try f.send("GET /x HTTP/1.0\r\nHost: app\r\n\(field)\r\n")
        let text = try f.clientOutput()
        #expect(text.hasPrefix("HTTP/1.1 403 Forbidden\r\n"), "\(name)")
        #expect(text.lowercased().contains(says), "\(name): \(text)")
        f.loop.run()
        #expect(f.client.isActive == staysOpen, "\(name)")
    }

    @Test("a relayed response to an HTTP/1.0 client that asked for keep-alive says so, and the connection serves the next request")
    func relayed() throws {
        let f = try ClientConnectionTests().makeFixture()
        try f.send("GET /a HTTP/1.0\r\nHost: app\r\nConnection: keep-alive\r\n\r\n")
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        let text = try f.clientOutput()
        #expect(text.lowercased().contains("connection: keep-alive\r\n"), "\(text)")
        #expect(f.client.isActive)
        _ = try f.upstreamOutput(0)
        try f.send("GET /b HTTP/1.0\r\nHost: app\r\nConnection: keep-alive\r\n\r\n")
        #expect(try f.upstreamOutput(0).hasPrefix("GET /b "))
    }
}
