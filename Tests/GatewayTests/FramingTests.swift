import TestSupport
import Testing

/// Request smuggling and parser-differential classes (`docs/security.md`, *HTTP/1.1 framing*):
/// each case is sent on a raw socket and must be answered 400 (or 431), the connection closed,
/// and nothing forwarded to the upstream.
@Suite("Framing strictness (raw sockets)", .serialized)
struct FramingTests {
    struct Case: CustomTestStringConvertible, Sendable {
        let name: String
        let raw: String
        let status: Int
        var testDescription: String { name }
    }

    static let long = String(repeating: "a", count: 17_000)

    static let cases: [Case] = [
        // Content-Length with Transfer-Encoding
        Case(name: "CL then TE", raw: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 400),
        Case(name: "TE then CL", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", status: 400),
        Case(name: "TE chunked with CL 0", raw: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 400),
        // duplicate or malformed Content-Length
        Case(name: "duplicate CL, same value", raw: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", status: 400),
        Case(name: "duplicate CL, different values", raw: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", status: 400),
        Case(name: "CL list", raw: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\nx", status: 400),
        Case(name: "empty CL", raw: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n", status: 400),
        Case(name: "signed CL", raw: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\nx", status: 400),
        // Transfer-Encoding other than exactly chunked
        Case(name: "TE gzip", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", status: 400),
        Case(name: "TE chunked, gzip", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", status: 400),
        Case(name: "TE gzip, chunked", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", status: 400),
        Case(name: "TE xchunked", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", status: 400),
        Case(name: "TE twice", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 400),
        Case(name: "TE in HTTP/1.0", raw: "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 400),
        // obs-fold
        Case(name: "obs-fold with space", raw: "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n b\r\n\r\n", status: 400),
        Case(name: "obs-fold with tab", raw: "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n\tb\r\n\r\n", status: 400),
        Case(name: "obs-fold of Transfer-Encoding", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", status: 400),
        // bare LF
        Case(name: "bare LF everywhere", raw: "GET / HTTP/1.1\nHost: a\n\n", status: 400),
        Case(name: "bare LF after a header", raw: "GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n", status: 400),
        Case(name: "bare LF ending the head", raw: "GET / HTTP/1.1\r\nHost: a\r\n\n", status: 400),
        Case(name: "bare CR in a value", raw: "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n", status: 400),
        // header names
        Case(name: "empty header name", raw: "GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n", status: 400),
        Case(name: "space before colon", raw: "GET / HTTP/1.1\r\nHost : a\r\n\r\n", status: 400),
        Case(name: "space in name", raw: "GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n", status: 400),
        Case(name: "NUL in value", raw: "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\u{0}b\r\n\r\n", status: 400),
        // chunked body
        Case(name: "bad chunk size", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n", status: 400),
        Case(name: "chunk size overflow", raw: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nx\r\n0\r\n\r\n", status: 400),
        // Host
        Case(name: "duplicate Host", raw: "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", status: 400),
        Case(name: "missing Host", raw: "GET / HTTP/1.1\r\n\r\n", status: 400),
        Case(name: "absolute-form for another host", raw: "GET http://evil.example/admin HTTP/1.1\r\nHost: a\r\n\r\n", status: 400),
        Case(name: "opaque target", raw: "GET http:http://a/admin HTTP/1.1\r\nHost: a\r\n\r\n", status: 400),
        // request line
        Case(name: "HTTP/2 preface", raw: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", status: 400),
        Case(name: "garbage request line", raw: "HELLO\r\n\r\n", status: 400),
        // sizes
        Case(name: "endless request line", raw: "GET /\(String(repeating: "a", count: 100_000))", status: 431),
        Case(name: "huge request target", raw: "GET /\(String(repeating: "a", count: 40_000)) HTTP/1.1\r\nHost: a\r\n\r\n", status: 431),
        Case(name: "one huge header", raw: "GET / HTTP/1.1\r\nHost: a\r\nX-A: \(long)\r\n\r\n", status: 431),
        Case(name: "too many headers", raw: "GET / HTTP/1.1\r\nHost: a\r\n" + (0..<120).map { "X-\($0): v\r\n" }.joined() + "\r\n", status: 431),
        Case(name: "large header block", raw: "GET / HTTP/1.1\r\nHost: a\r\n" + (0..<20).map { "X-\($0): \(String(repeating: "b", count: 1000))\r\n" }.joined() + "\r\n", status: 431),
    ]

    @Test("rejected, closed, never forwarded", arguments: cases)
    func rejected(_ c: Case) async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let (status, closed) = try await blocking {
                // 38 cases run in parallel with the other suites on 2 cores: seconds of margin.
                let client = try RawClient(port: port, timeoutSeconds: 20)
                try client.send(c.raw)
                let response = try client.readResponse()
                return (response.status, client.waitForClose())
            }
            #expect(status == c.status)
            #expect(closed, "the connection must be closed after a framing error")
            #expect(h.upstream.stats.withLockedValue { $0.requests } == 0, "nothing may reach the upstream")
        }
    }

    @Test("bytes sent after an upgrade request, before any answer, are bounded")
    func floodAfterUpgradeRequest() async throws {
        try await ProxyHarness.with { h in
            let flood = String(repeating: "x", count: 64 * 1024)
            let response = try await h.request("GET /hang HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + flood)
            #expect(response.status == 431)
        }
    }

    @Test("a well-formed request on the same socket after a smuggling attempt is never served")
    func noDesync() async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let responses = try await blocking { () -> [Int] in
                let client = try RawClient(port: port, timeoutSeconds: 5)
                try client.send("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n")
                var statuses = [try client.readResponse().status]
                while let r = try? client.readResponse() { statuses.append(r.status) }
                return statuses
            }
            #expect(responses == [400])
            #expect(h.upstream.stats.withLockedValue { $0.paths }.isEmpty)
        }
    }
}
