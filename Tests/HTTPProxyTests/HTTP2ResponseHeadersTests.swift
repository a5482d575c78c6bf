import NIOCore
import NIOHPACK
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// What an HTTP/2 client is shown of an upstream's response and of the gateway's own: the
/// HTTP/1.1 relay's rules, in HTTP/2's form.
@Suite("HTTP/2 response headers")
struct HTTP2ResponseHeadersTests {
    let rules = RequestHeaderRules(identityHeaders: [], hiddenCookies: ["__Host-sessiongate"])

    func response(_ text: String) throws -> ResponseHead {
        var parser = HeadParser(kind: .response)
        var buffer = ByteBuffer(string: text)
        return ResponseHead(try #require(try parser.parse(&buffer)))
    }

    func relayed(_ text: String, requestID: String? = "req-1") throws -> [(String, String)] {
        HTTP2ResponseHeaders.relayed(try response(text), rules: rules, requestID: requestID).map { ($0.name, $0.value) }
    }

    /// The HTTP/1.1 relay's field lines for the same response, names lower-cased (no status line,
    /// no `connection` the proxy adds).
    func http1Fields(_ text: String, requestID: String? = "req-1") throws -> [(String, String)] {
        var buffer = ByteBuffer()
        try response(text).write(rules: rules, .init(requestID: requestID, chunked: false, keepAlive: true, clientVersion: .http1_1), into: &buffer)
        return String(buffer: buffer).split(separator: "\r\n").dropFirst().compactMap { line in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            let name = line[..<colon].lowercased()
            return name == "connection" ? nil : (name, String(line[line.index(after: colon)...].drop { $0 == " " }))
        }
    }

    @Test(":status first, names lower case, the app's fields in order, x-request-id added")
    func relayedOrder() throws {
        let fields = try relayed("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nX-App: 1\r\n\r\n")
        #expect(fields.map(\.0) == [":status", "content-type", "content-length", "x-app", "x-request-id"])
        #expect(fields.map(\.1) == ["200", "text/plain", "2", "1", "req-1"])
    }

    @Test("the app's own x-request-id is kept, none added")
    func appRequestID() throws {
        let fields = try relayed("HTTP/1.1 204 No Content\r\nX-Request-Id: app\r\n\r\n")
        #expect(fields.filter { $0.0 == "x-request-id" }.map(\.1) == ["app"])
    }

    @Test("connection-specific fields never reach an HTTP/2 client", arguments: [
        "Connection: keep-alive", "Keep-Alive: timeout=5", "Proxy-Connection: keep-alive", "Transfer-Encoding: chunked", "Upgrade: h2c",
        "TE: trailers", "Trailer: x", "Proxy-Authenticate: Basic",
    ])
    func connectionSpecific(_ line: String) throws {
        let fields = try relayed("HTTP/1.1 200 OK\r\n\(line)\r\nX-App: 1\r\n\r\n")
        #expect(fields.map(\.0) == [":status", "x-app", "x-request-id"])
    }

    @Test("fields the app named in Connection are dropped")
    func connectionNamed() throws {
        let fields = try relayed("HTTP/1.1 200 OK\r\nConnection: x-secret, close\r\nX-Secret: 1\r\nX-App: 1\r\n\r\n")
        #expect(fields.map(\.0) == [":status", "x-app", "x-request-id"])
    }

    @Test("the gateway's own Set-Cookie is withheld, as for HTTP/1.1; the app's own pass", arguments: [
        ("__Host-sessiongate=forged; Path=/", false), ("__HOST-SESSIONGATE=x", false), ("app=1; Path=/", true),
    ])
    func hiddenSetCookie(_ value: String, _ kept: Bool) throws {
        let fields = try relayed("HTTP/1.1 200 OK\r\nSet-Cookie: \(value)\r\n\r\n")
        #expect(fields.contains { $0.0 == "set-cookie" } == kept)
    }

    @Test("content-length on a 204 is dropped")
    func noContentLength() throws {
        #expect(try relayed("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n").map(\.0) == [":status", "x-request-id"])
    }

    @Test("HTTP/2 and HTTP/1.1 clients are shown the same fields of a response", arguments: [
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nSet-Cookie: app=1\r\nSet-Cookie: __Host-sessiongate=x\r\nContent-Length: 5\r\n\r\n",
        "HTTP/1.1 302 Found\r\nLocation: /x\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 404 Not Found\r\nKeep-Alive: timeout=5\r\nX-Request-Id: app-id\r\nVary: Accept\r\n\r\n",
    ])
    func sameAsHTTP1(_ text: String) throws {
        let http2 = try relayed(text).dropFirst()
        let http1 = try http1Fields(text)
        #expect(http2.map(\.0) == http1.map(\.0))
        #expect(http2.map(\.1) == http1.map(\.1))
    }

    @Test("a local response is HEADERS (:status, its fields lower case, x-request-id, content-length) and DATA")
    func local() {
        let response = LocalResponse(status: .found, headers: [("Location", "/_auth/sign-in"), ("Set-Cookie", "a=1")], body: ByteBuffer(string: "go"))
        let (headers, body) = HTTP2ResponseHeaders.local(response, requestID: "r", headRequest: false)
        #expect(headers.map(\.name) == [":status", "location", "set-cookie", "x-request-id", "content-length"])
        #expect(headers.map(\.value) == ["302", "/_auth/sign-in", "a=1", "r", "2"])
        #expect(body.map { String(buffer: $0) } == "go")
    }

    @Test("a local response drops unsafe and connection-specific fields; HEAD and empty bodies send no DATA")
    func localEdges() {
        let response = LocalResponse(status: .serviceUnavailable, headers: [("Connection", "close"), ("X-Bad", "a\r\nb"), ("Retry-After", "1")],
                                     body: ByteBuffer(string: "x"), close: true)
        let (headers, body) = HTTP2ResponseHeaders.local(response, requestID: nil, headRequest: true)
        #expect(headers.map(\.name) == [":status", "retry-after", "content-length"])
        #expect(headers.first(name: "content-length") == "1", "HEAD: the length of the body a GET would get")
        #expect(body == nil)
        #expect(HTTP2ResponseHeaders.local(LocalResponse(status: .noContent), requestID: nil, headRequest: false).body == nil)
    }
}
