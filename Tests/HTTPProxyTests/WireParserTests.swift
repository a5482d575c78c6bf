import NIOCore
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// The wire engine's parsing rules, one row each: what a head or body reads as, or why it is
/// refused (400: `malformed`, 431: `tooLarge`).
@Suite("Wire engine: heads, framing and bodies")
struct WireParserTests {
    enum Expected: Equatable, Sendable {
        /// Parsed: the body (chunks joined) and the trailers as `name: value` lines.
        case request(method: String, target: String, minor: Int, headers: [String], body: String = "", trailers: [String] = [])
        case malformed
        case tooLarge
    }

    struct Case: CustomTestStringConvertible, Sendable {
        let name: String
        let raw: String
        let expected: Expected
        var testDescription: String { name }
        init(_ name: String, _ raw: String, _ expected: Expected) {
            self.name = name
            self.raw = raw
            self.expected = expected
        }
    }

    static let long = String(repeating: "a", count: 17_000)

    static let cases: [Case] = [
        Case("plain GET", "GET /a?b HTTP/1.1\r\nHost: a\r\nX-A:  spaced \t\r\n\r\n",
             .request(method: "GET", target: "/a?b", minor: 1, headers: ["Host: a", "X-A: spaced"])),
        Case("HTTP/1.0, no Host", "GET / HTTP/1.0\r\n\r\n", .request(method: "GET", target: "/", minor: 0, headers: [])),
        Case("empty lines before the request line", "\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
             .request(method: "GET", target: "/", minor: 1, headers: ["Host: a"])),
        Case("empty value", "GET / HTTP/1.1\r\nHost: a\r\nX-E:\r\n\r\n", .request(method: "GET", target: "/", minor: 1, headers: ["Host: a", "X-E: "])),
        Case("obs-text in a value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: \u{e9}\r\n\r\n",
             .request(method: "GET", target: "/", minor: 1, headers: ["Host: a", "X-A: \u{e9}"])),
        Case("length body", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
             .request(method: "POST", target: "/", minor: 1, headers: ["Host: a", "Content-Length: 5"], body: "hello")),
        Case("chunked body with extensions and trailers",
             "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n5;a=b\r\nhello\r\nA\r\n0123456789\r\n0;last\r\nX-T: 1\r\n\r\n",
             .request(method: "POST", target: "/", minor: 1, headers: ["Host: a", "Transfer-Encoding: Chunked"], body: "hello0123456789",
                      trailers: ["X-T: 1"])),
        Case("WebDAV and llhttp's other methods", "M-SEARCH * HTTP/1.1\r\nHost: a\r\n\r\n",
             .request(method: HTTPMethod.MSEARCH.rawValue, target: "*", minor: 1, headers: ["Host: a"])),
        // framing (FramingTests sends the same to the whole gateway)
        Case("CL then TE", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", .malformed),
        Case("TE then CL", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", .malformed),
        Case("duplicate CL, same value", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", .malformed),
        Case("CL list", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\nx", .malformed),
        Case("empty CL", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n", .malformed),
        Case("signed CL", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\nx", .malformed),
        Case("TE gzip", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", .malformed),
        Case("TE chunked, gzip", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", .malformed),
        Case("TE twice", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", .malformed),
        Case("TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", .malformed),
        Case("obs-fold with space", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n b\r\n\r\n", .malformed),
        Case("obs-fold with tab", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n\tb\r\n\r\n", .malformed),
        Case("bare LF everywhere", "GET / HTTP/1.1\nHost: a\n\n", .malformed),
        Case("bare LF after a header", "GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n", .malformed),
        Case("bare LF ending the head", "GET / HTTP/1.1\r\nHost: a\r\n\n", .malformed),
        Case("bare CR in a value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n", .malformed),
        Case("a line starting with CR", "GET / HTTP/1.1\r\nHost: a\r\n\rX-A: b\r\n\r\n", .malformed),
        Case("empty header name", "GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n", .malformed),
        Case("space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", .malformed),
        Case("space in name", "GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n", .malformed),
        Case("NUL in value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\u{0}b\r\n\r\n", .malformed),
        Case("DEL in value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\u{7f}\r\n\r\n", .malformed),
        Case("bad chunk size", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n", .malformed),
        Case("chunk size overflow", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nx\r\n0\r\n\r\n", .malformed),
        Case("chunk data without CRLF", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n", .malformed),
        Case("endless chunk extension", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;" + String(repeating: "a", count: 5000), .malformed),
        Case("trailer with space before colon", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T : 1\r\n\r\n", .malformed),
        // request line
        Case("HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", .malformed),
        Case("garbage request line", "HELLO\r\n\r\n", .malformed),
        Case("unknown method", "FOO / HTTP/1.1\r\nHost: a\r\n\r\n", .malformed),
        Case("lower-case method", "get / HTTP/1.1\r\nHost: a\r\n\r\n", .malformed),
        Case("two spaces after the method", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", .malformed),
        Case("HTTP/1.2", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", .malformed),
        Case("control character in the target", "GET /a\u{1}b HTTP/1.1\r\nHost: a\r\n\r\n", .malformed),
        Case("non-ASCII target", "GET /\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n", .malformed),
        // sizes
        Case("endless request line", "GET /\(String(repeating: "a", count: 100_000))", .tooLarge),
        Case("huge request target", "GET /\(String(repeating: "a", count: 40_000)) HTTP/1.1\r\nHost: a\r\n\r\n", .tooLarge),
        Case("one huge header", "GET / HTTP/1.1\r\nHost: a\r\nX-A: \(long)\r\n\r\n", .tooLarge),
        Case("too many headers", "GET / HTTP/1.1\r\nHost: a\r\n" + (0..<120).map { "X-\($0): v\r\n" }.joined() + "\r\n", .tooLarge),
        Case("large header block", "GET / HTTP/1.1\r\nHost: a\r\n" + (0..<20).map { "X-\($0): \(String(repeating: "b", count: 1000))\r\n" }.joined() + "\r\n", .tooLarge),
    ]

    /// Parses one request from `raw`, fed in pieces of `piece` bytes.
    static func parse(_ raw: [UInt8], piece: Int) -> Expected? {
        var parser = HeadParser(kind: .request)
        var buffer = ByteBuffer()
        var head: WireHead? = nil
        var decoder: BodyDecoder? = nil
        var body: [UInt8] = []
        var offset = 0
        do {
            while offset < raw.count {
                buffer.writeBytes(raw[offset..<min(offset + piece, raw.count)])
                offset += piece
                if head == nil {
                    head = try parser.parse(&buffer)
                    if let head { decoder = BodyDecoder(try MessageFraming.request(head)) }
                }
                while let part = try decoder?.next(&buffer) {
                    switch part {
                    case .body(let bytes): body += bytes.readableBytesView
                    case .end(let trailers):
                        let head = head!
                        return .request(method: head.method.rawValue, target: head.target, minor: head.version.minor,
                                        headers: head.fields.map { "\(head.name($0)): \(head.value($0))" },
                                        body: String(decoding: body, as: UTF8.self),
                                        trailers: trailers.map { t in t.fields.map { "\(t.name($0)): \(t.value($0))" } } ?? [])
                    }
                }
            }
        } catch {
            // The parser throws WireError only (typed throws).
            if case .tooLarge = error { return .tooLarge }
            return .malformed
        }
        return nil
    }

    @Test("each row, whole and byte by byte", arguments: cases)
    func row(_ c: Case) {
        let raw = Array(c.raw.utf8)
        #expect(Self.parse(raw, piece: raw.count) == c.expected, "whole")
        #expect(Self.parse(raw, piece: 1) == c.expected, "byte by byte")
    }

    @Test("pipelined requests leave the next one's bytes in the buffer")
    func pipelined() throws {
        var parser = HeadParser(kind: .request)
        var buffer = ByteBuffer(string: "POST /1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nokGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        let first = try #require(try parser.parse(&buffer))
        var body = BodyDecoder(try MessageFraming.request(first))
        #expect(try body.next(&buffer) == .body(ByteBuffer(string: "ok")))
        #expect(try body.next(&buffer) == .end(nil))
        #expect(try body.next(&buffer) == nil)
        let second = try #require(try parser.parse(&buffer))
        #expect(second.target == "/2")
        #expect(buffer.readableBytes == 0)
    }

    @Test("the head keeps the bytes as sent: each field line is where its offsets say")
    func offsets() throws {
        var parser = HeadParser(kind: .request)
        let raw = "GET / HTTP/1.1\r\nHost: a\r\nX-Mixed-Case:  v1 \r\n\r\n"
        var buffer = ByteBuffer(string: raw)
        let head = try #require(try parser.parse(&buffer))
        #expect(head.bytes.readableBytes == raw.utf8.count)
        #expect(Int(head.fieldsStart) == "GET / HTTP/1.1\r\n".utf8.count)
        let field = head.fields[1]
        #expect(head.bytes.getString(at: Int(field.nameStart), length: Int(field.lineEnd - field.nameStart)) == "X-Mixed-Case:  v1 \r\n")
        #expect(head.nameIs(field, "x-mixed-case"))
        #expect(!head.nameIs(field, "x-mixed-cas"))
        #expect(head.value(field) == "v1")
    }

    @Test("status lines", arguments: [
        ("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 200, "OK"),
        ("HTTP/1.0 404 Not Found\r\n\r\n", 404, "Not Found"),
        ("HTTP/1.1 204\r\n\r\n", 204, ""),
        ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", 101, "Switching Protocols"),
    ])
    func statusLine(_ raw: String, _ status: Int, _ reason: String) throws {
        var parser = HeadParser(kind: .response)
        var buffer = ByteBuffer(string: raw)
        let head = try #require(try parser.parse(&buffer))
        #expect(head.status == status)
        #expect(head.reason == reason)
    }

    @Test("bad status lines", arguments: ["HTTP/1.1 20 OK\r\n\r\n", "HTTP/1.1 2000 OK\r\n\r\n", "HTTP/1.1 099 x\r\n\r\n", "HTTP/2 200 OK\r\n\r\n",
                                          "\r\nHTTP/1.1 200 OK\r\n\r\n", "HTTP/1.1  200 OK\r\n\r\n", "HTTP/1.1 200 O\u{1}K\r\n\r\n"])
    func badStatusLine(_ raw: String) {
        var parser = HeadParser(kind: .response)
        var buffer = ByteBuffer(string: raw)
        #expect(throws: WireError.self) { try parser.parse(&buffer) }
    }

    @Test("a body read until close ends at EOF; a length or chunked body cut short is an error")
    func endOfInput() throws {
        var untilClose = BodyDecoder(.untilClose)
        var buffer = ByteBuffer(string: "abc")
        #expect(try untilClose.next(&buffer) == .body(ByteBuffer(string: "abc")))
        #expect(try untilClose.next(&buffer) == nil)
        #expect(try untilClose.finish() == .end(nil))
        var length = BodyDecoder(.contentLength(10))
        _ = try length.next(&buffer)
        #expect(throws: WireError.self) { try length.finish() }
    }

    /// What an upstream connection's reader makes of a response to one request: its status
    /// (or the refusal), body and whether bytes were left behind it.
    static func read(_ raw: String, method: HTTPMethod = .GET, byteByByte: Bool = false) -> (status: Int?, body: String, refused: String?) {
        var reader = ResponseReader()
        reader.expectResponse(to: method)
        var status: Int? = nil
        var body = ""
        let chunks: [ByteBuffer] = byteByByte ? raw.utf8.map { ByteBuffer(bytes: [$0]) } : [ByteBuffer(string: raw)]
        do {
            for chunk in chunks {
                reader.receive(chunk)
                while let part = try reader.next() {
                    switch part {
                    case .head(let head): if head.status >= 200 { status = head.status }
                    case .body(let bytes): body += String(buffer: bytes)
                    case .end: return (status, body, nil)
                    }
                }
            }
            while let part = try reader.finish() {
                if case .body(let bytes) = part { body += String(buffer: bytes) } else { return (status, body, nil) }
            }
            return (status, body, "incomplete")
        } catch {
            return (status, body, "\(error)")
        }
    }

    @Test("upstream responses: framing refused where two hops could read it differently (the 502 rows of the proxy)", arguments: [
        ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", .GET, 200, "hello", nil),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", .GET, 200, "hello", nil),
        ("HTTP/1.1 200 OK\r\n\r\nuntil close", .GET, 200, "until close", nil),
        ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", .HEAD, 200, "", nil),
        ("HTTP/1.1 204 No Content\r\n\r\n", .GET, 204, "", nil),
        ("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", .POST, 200, "ok", nil),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nsecret", .GET, nil, "", "ambiguous response framing"),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", .GET, nil, "", "ambiguous response framing"),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", .GET, nil, "", "ambiguous response framing"),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", .GET, nil, "", "ambiguous response framing"),
        ("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: gzip\r\n\r\n", .GET, nil, "", "ambiguous response framing"),
        ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", .GET, nil, "", "duplicate Content-Length"),
        ("HTTP/1.1 099 Odd\r\nContent-Length: 5\r\n\r\nhello", .GET, nil, "", "invalid status line"),
        ("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", .GET, 200, "hello", "connection closed within the body"),
        ("HTTP/1.1 200 OK\r\nContent-Le", .GET, nil, "", "connection closed within a head"),
    ] as [(String, HTTPMethod, Int?, String, String?)])
    func upstreamResponse(_ raw: String, _ method: HTTPMethod, _ status: Int?, _ body: String, _ refused: String?) {
        for byteByByte in [false, true] {
            let result = Self.read(raw, method: method, byteByByte: byteByByte)
            #expect(result.status == status, "\(raw) byte by byte: \(byteByByte)")
            #expect(result.body == body, "\(raw) byte by byte: \(byteByByte)")
            #expect(result.refused == refused, "\(raw) byte by byte: \(byteByByte)")
        }
    }

    @Test("bytes behind a 101 are the tunnel's; bytes nobody asked for are refused")
    func upgradeAndUnsolicited() throws {
        var reader = ResponseReader()
        reader.expectResponse(to: .GET)
        reader.receive(ByteBuffer(string: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\u{81}\u{1}x"))
        guard case .head(let head) = try reader.next() else { Issue.record("no head"); return }
        #expect(head.status == 101)
        #expect(try reader.next() == nil)
        #expect(String(buffer: reader.takeRemaining()) == "\u{81}\u{1}x")

        var idle = ResponseReader()
        idle.receive(ByteBuffer(string: "HTTP/1.1 200 OK\r\n\r\n"))
        #expect(throws: WireError.malformed("unsolicited response")) { try idle.next() }
        var afterEnd = ResponseReader()
        afterEnd.expectResponse(to: .GET)
        afterEnd.receive(ByteBuffer(string: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n\r\n"))
        _ = try afterEnd.next()
        guard case .end = try afterEnd.next() else { Issue.record("no end"); return }
        #expect(afterEnd.hasUnreadBytes)
        #expect(throws: WireError.malformed("line ends after a response")) { try afterEnd.next() }
    }

    @Test("a client that always leaves the next request's first byte behind does not make the reader keep what it read")
    func boundedCumulation() throws {
        var reader = RequestReader(maxHeadBytes: 16 * 1024, maxFields: 100)
        let request = "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 1024\r\n\r\n" + String(repeating: "x", count: 1024)
        var received = 0
        for index in 0..<1000 {
            // Each read: the rest of one request and the first byte of the next.
            let bytes = index == 0 ? request + "P" : String(request.dropFirst()) + "P"
            reader.receive(ByteBuffer(string: bytes))
            received += bytes.utf8.count
            while let part = try reader.next() {
                if case .end = part { continue }
            }
        }
        #expect(received > 1_000_000)
        #expect(reader.bufferCapacity < 64 * 1024, "the reader kept \(reader.bufferCapacity) bytes of \(received) received")
    }

    static func responseHead(_ raw: String, hiddenCookies: [String] = []) throws -> String {
        var parser = HeadParser(kind: .response)
        var buffer = ByteBuffer(string: raw)
        let head = ResponseHead(try #require(try parser.parse(&buffer)))
        var out = ByteBuffer()
        head.write(rules: RequestHeaderRules(identityHeaders: [], hiddenCookies: hiddenCookies), .init(requestID: "gw-id"), into: &out)
        return String(buffer: out)
    }

    @Test("response heads reach the client as sent, less what the rules remove", arguments: [
        ("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n",
         "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nx-request-id: gw-id\r\n\r\n"),
        // An app naming its framing or its id in Connection keeps both: a body without its
        // length on a kept-alive connection would swallow the next response.
        ("HTTP/1.1 200 OK\r\nConnection: content-length, x-request-id, x-private\r\nContent-Length: 5\r\nX-Request-Id: app\r\nX-Private: 1\r\nX-Kept: 2\r\n\r\n",
         "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Request-Id: app\r\nX-Kept: 2\r\n\r\n"),
        ("HTTP/1.1 204 No Content\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\nSet-Cookie: __Host-sg=x\r\nSet-Cookie: theme=dark\r\n\r\n",
         "HTTP/1.1 204 No Content\r\nSet-Cookie: theme=dark\r\nx-request-id: gw-id\r\n\r\n"),
    ])
    func responseHeads(_ raw: String, _ expected: String) throws {
        #expect(try Self.responseHead(raw, hiddenCookies: ["__Host-sg"]) == expected)
    }

    @Test("the upstream head: the client's lines as sent, a guard's removal winning over the rules' rewrite")
    func upstreamRequestHead() throws {
        var parser = HeadParser(kind: .request)
        var buffer = ByteBuffer(string: "GET /a HTTP/1.1\r\nHost: A.example.\r\nCookie: __Host-sg=1; theme=dark\r\nAuthorization: Bearer t\r\nX-Auth-User: spoof\r\nAccept: */*\r\n\r\n")
        let wire = try #require(try parser.parse(&buffer))
        let rules = RequestHeaderRules(identityHeaders: ["X-Auth-User"], hiddenCookies: ["__Host-sg"])
        let inbound = try rules.inspect(wire, peerTrusted: false).get()
        var out = ByteBuffer()
        UpstreamRequestHead(method: .GET, target: "/a", adding: [("X-Forwarded-For", "1.2.3.4")]).write(inbound, into: &out)
        #expect(String(buffer: out) == "GET /a HTTP/1.1\r\nHost: a.example\r\nCookie: theme=dark\r\nAuthorization: Bearer t\r\nAccept: */*\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n")
        out.clear()
        UpstreamRequestHead(method: .GET, target: "/a", removing: ["authorization", "cookie"], replacesHost: true, adding: [("Host", "app")]).write(inbound, into: &out)
        #expect(String(buffer: out) == "GET /a HTTP/1.1\r\nAccept: */*\r\nHost: app\r\n\r\n")
    }
}
