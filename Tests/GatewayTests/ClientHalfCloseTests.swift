#if canImport(Glibc)
import Glibc
#endif
import Foundation
import HTTPProxy
import NIOConcurrencyHelpers
import TestSupport
import Testing

/// Every exchange the proxy reports, in order.
final class RecordedExchanges: ProxyObserver {
    let records = NIOLockedValueBox<[ExchangeRecord]>([])
    var wantsRequestDetails: Bool { false }
    func exchangeCompleted(_ record: ExchangeRecord) { records.withLockedValue { $0.append(record) } }
    func upstreamFailed(_ kind: UpstreamErrorKind, route: String) {}
    func clientConnectionOpened() {}
    func clientConnectionClosed() {}
    func upstreamConnectionOpened(_ upstream: UpstreamAddress) {}
    func upstreamConnectionClosed() {}
}

/// A client that goes away, or half-closes, before it is done (issue 23 §3): on raw sockets
/// against a real proxy, what the app sees, what the client gets and what is logged.
@Suite("Client half-close and departure (raw sockets)", .serialized, .timeLimit(.minutes(3)))
struct ClientHalfCloseTests {
    /// Far above the bounds the tests check: what only ends at a timeout fails them.
    static let longTimeouts = ProxyConfiguration.Timeouts(upstreamConnect: .seconds(2), upstreamResponse: .seconds(30), idle: .seconds(30),
                                                          requestBody: .seconds(30))

    @Test("a client gone inside a request body: the app's connection closes at once, the log says the client aborted (499), no 504", arguments: [
        ("half-close", true), ("full close", false),
    ])
    func goneMidBody(_ name: String, halfClose: Bool) async throws {
        let app = try RawListener()
        let exchanges = RecordedExchanges()
        try await ProxyHarness.with(timeouts: Self.longTimeouts, upstreamPort: app.port, observer: exchanges) { h in
            let port = h.port
            let (appSawClose, seconds, answered) = try await blocking { () -> (Bool, Double, Bool) in
                let client = try RawClient(port: port, timeoutSeconds: 10)
                try client.send("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
                // The app's side reads with a 3 s receive timeout: the upper bound of every wait below.
                let upstream = try app.accept(timeoutSeconds: 3)
                _ = try upstream.readUntil("\r\n\r\n")
                _ = try upstream.read(count: 10)
                if halfClose { shutdown(client.fd, Int32(SHUT_WR)) } else { client.disconnect() }
                let start = Date()
                let closed = upstream.waitForClose()
                let seconds = Date().timeIntervalSince(start)
                // Nothing can be answered to a request that never arrived whole.
                let answered = halfClose && (try? client.readResponse()) != nil
                return (closed, seconds, answered)
            }
            #expect(appSawClose, "\(name): the truncated request stays open at the app")
            #expect(seconds < 2, "\(name): \(seconds) s")
            #expect(!answered, "\(name)")
            let records = exchanges.records.withLockedValue { $0 }
            #expect(records.map(\.status) == [ExchangeRecord.clientClosedRequest], "\(name)")
            #expect(records.map(\.aborted) == [true], "\(name)")
        }
    }

    static let get1 = "GET /echo/1 HTTP/1.1\r\nHost: a\r\n\r\n"
    static let get3 = "GET /echo/3 HTTP/1.1\r\nHost: a\r\n\r\n"

    @Test("every request complete before the client's FIN is answered, in order; then the connection closes", arguments: [
        ("three GETs", get1 + "GET /echo/2 HTTP/1.1\r\nHost: a\r\n\r\n" + get3, ["/echo/1", "/echo/2", "/echo/3"]),
        ("a POST with a body in the middle", get1 + "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello" + get3,
         ["/echo/1", "/upload", "/echo/3"]),
        ("a GET, then half a head", get1 + "GET /echo/2 HTTP/1.1\r\nHo", ["/echo/1"]),
        ("a GET, then a POST cut short in its body", get1 + "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc", ["/echo/1"]),
    ])
    func finAfterPipelined(_ name: String, raw: String, answered: [String]) async throws {
        try await ProxyHarness.with(timeouts: Self.longTimeouts) { h in
            let port = h.port
            let (responses, closed) = try await blocking { () -> ([RawClient.Response], Bool) in
                let client = try RawClient(port: port, timeoutSeconds: 3)
                try client.send(raw)
                shutdown(client.fd, Int32(SHUT_WR))
                var responses: [RawClient.Response] = []
                while responses.count < answered.count, let response = try? client.readResponse() { responses.append(response) }
                return (responses, client.waitForClose())
            }
            #expect(responses.map(\.status) == answered.map { _ in 200 }, "\(name)")
            #expect(zip(responses, answered).allSatisfy { response, path in
                path == "/upload" ? response.text.hasPrefix("n=5") : response.text.hasPrefix("GET \(path) ")
            }, "\(name): \(responses.map(\.text))")
            #expect(closed, "\(name): closed after the last answer, not at a timeout")
            #expect(h.upstream.stats.withLockedValue { $0.completed } == answered, "\(name)")
        }
    }

    @Test("a WebSocket handshake followed at once by the client's FIN: the tunnel passes the FIN on to the app, and closes")
    func finBeforeTunnel() async throws {
        try await ProxyHarness.with(timeouts: Self.longTimeouts) { h in
            let port = h.port
            let (status, closed) = try await blocking { () -> (Int, Bool) in
                let client = try RawClient(port: port, timeoutSeconds: 3)
                try client.send("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
                shutdown(client.fd, Int32(SHUT_WR))
                let status = try client.readResponse().status
                // The app (which closes on its peer's FIN) ends the tunnel: not an open half forever.
                return (status, client.waitForClose())
            }
            #expect(status == 101)
            #expect(closed)
        }
    }
}
