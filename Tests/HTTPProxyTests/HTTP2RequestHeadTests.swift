import NIOCore
import NIOHPACK
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// An HTTP/2 header block is checked by RFC 9113's rules, then presented to admission as the
/// HTTP/1.1 head it stands for: each refusal class, and what the head made says.
@Suite("HTTP/2 request head")
struct HTTP2RequestHeadTests {
    static let get: [(String, String)] = [(":method", "GET"), (":scheme", "https"), (":authority", "app.example.com"), (":path", "/a?b=1")]

    func make(_ fields: [(String, String)], endStream: Bool = true, maxHeadBytes: Int = 16 * 1024, maxFields: Int = 100)
        -> Result<HTTP2RequestHead, HTTP2RequestRefusal> {
        HTTP2RequestHead.make(HPACKHeaders(fields), endStream: endStream, maxHeadBytes: maxHeadBytes, maxFields: maxFields)
    }

    /// The head's bytes, as the wire engine read them.
    func bytes(_ fields: [(String, String)], endStream: Bool = true) throws -> String {
        let head = try make(fields, endStream: endStream).get().head
        return String(buffer: head.bytes)
    }

    struct Refused: CustomTestStringConvertible, Sendable {
        let name: String
        let fields: [(String, String)]
        var endStream = true
        let refusal: HTTP2RequestRefusal
        var testDescription: String { name }
    }

    static let refused: [Refused] = [
        Refused(name: "a pseudo-header after a regular field", fields: [(":method", "GET"), (":scheme", "https"), ("accept", "*/*"), (":path", "/"), (":authority", "a")],
                refusal: .pseudoHeaderAfterField(":path")),
        Refused(name: "a duplicated :path", fields: get + [(":path", "/admin")], refusal: .duplicatePseudoHeader(":path")),
        Refused(name: "a duplicated :method", fields: [(":method", "GET"), (":method", "POST"), (":scheme", "https"), (":path", "/"), (":authority", "a")],
                refusal: .duplicatePseudoHeader(":method")),
        Refused(name: "a duplicated :authority", fields: get + [(":authority", "evil.example.com")], refusal: .duplicatePseudoHeader(":authority")),
        Refused(name: "an unknown pseudo-header", fields: get + [(":host", "a")], refusal: .unknownPseudoHeader(":host")),
        Refused(name: "a response pseudo-header in a request", fields: get + [(":status", "200")], refusal: .unknownPseudoHeader(":status")),
        Refused(name: "a missing :method", fields: [(":scheme", "https"), (":path", "/"), (":authority", "a")], refusal: .missingPseudoHeader(":method")),
        Refused(name: "a missing :scheme", fields: [(":method", "GET"), (":path", "/"), (":authority", "a")], refusal: .missingPseudoHeader(":scheme")),
        Refused(name: "a missing :path", fields: [(":method", "GET"), (":scheme", "https"), (":authority", "a")], refusal: .missingPseudoHeader(":path")),
        Refused(name: "an empty :path", fields: [(":method", "GET"), (":scheme", "https"), (":path", ""), (":authority", "a")], refusal: .invalidPath),
        Refused(name: "an absolute-form :path", fields: [(":method", "GET"), (":scheme", "https"), (":path", "http://evil/"), (":authority", "a")],
                refusal: .invalidPath),
        Refused(name: "an authority-form :path", fields: [(":method", "GET"), (":scheme", "https"), (":path", "a:443"), (":authority", "a")],
                refusal: .invalidPath),
        Refused(name: "a :path with a space", fields: [(":method", "GET"), (":scheme", "https"), (":path", "/a HTTP/1.1"), (":authority", "a")],
                refusal: .invalidPath),
        Refused(name: "a :path of * for GET", fields: [(":method", "GET"), (":scheme", "https"), (":path", "*"), (":authority", "a")], refusal: .invalidPath),
        Refused(name: "a :scheme other than http or https", fields: [(":method", "GET"), (":scheme", "ftp"), (":path", "/"), (":authority", "a")],
                refusal: .invalidScheme),
        Refused(name: "a :method with a space", fields: [(":method", "GET /x"), (":scheme", "https"), (":path", "/"), (":authority", "a")],
                refusal: .invalidMethod),
        Refused(name: "a method the wire engine does not know", fields: [(":method", "BREW"), (":scheme", "https"), (":path", "/"), (":authority", "a")],
                refusal: .malformedHead("invalid request line")),
        Refused(name: "CONNECT", fields: [(":method", "CONNECT"), (":authority", "a:443")], refusal: .connect),
        Refused(name: "CONNECT with a scheme and path", fields: [(":method", "CONNECT"), (":scheme", "https"), (":path", "/"), (":authority", "a:443")],
                refusal: .connect),
        Refused(name: "extended CONNECT (RFC 8441 WebSocket)",
                fields: [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":path", "/chat"), (":authority", "a")], refusal: .connect),
        Refused(name: ":protocol without CONNECT", fields: get + [(":protocol", "websocket")], refusal: .connect),
        Refused(name: "an upper-case field name", fields: get + [("Accept", "*/*")], refusal: .upperCaseName),
        Refused(name: "an upper-case identity header", fields: get + [("X-Auth-User", "admin")], refusal: .upperCaseName),
        Refused(name: "connection", fields: get + [("connection", "close")], refusal: .connectionSpecificField("connection")),
        Refused(name: "keep-alive", fields: get + [("keep-alive", "timeout=5")], refusal: .connectionSpecificField("keep-alive")),
        Refused(name: "proxy-connection", fields: get + [("proxy-connection", "keep-alive")], refusal: .connectionSpecificField("proxy-connection")),
        Refused(name: "transfer-encoding", fields: get + [("transfer-encoding", "chunked")], endStream: false,
                refusal: .connectionSpecificField("transfer-encoding")),
        Refused(name: "upgrade", fields: get + [("upgrade", "websocket")], refusal: .connectionSpecificField("upgrade")),
        Refused(name: "te other than trailers", fields: get + [("te", "gzip")], refusal: .teNotTrailers),
        Refused(name: "te trailers among others", fields: get + [("te", "trailers, deflate")], refusal: .teNotTrailers),
        Refused(name: "CR LF in a value (a header injected into the HTTP/1.1 head)", fields: get + [("x-a", "1\r\nx-auth-user: admin")],
                refusal: .forbiddenCharacter),
        Refused(name: "a bare LF in a value", fields: get + [("x-a", "1\nx-b: 2")], refusal: .forbiddenCharacter),
        Refused(name: "a bare CR in a value", fields: get + [("x-a", "1\rx")], refusal: .forbiddenCharacter),
        Refused(name: "NUL in a value", fields: get + [("x-a", "a\u{0}b")], refusal: .forbiddenCharacter),
        Refused(name: "CR LF in a name", fields: get + [("x-a\r\nx-auth-user", "admin")], refusal: .forbiddenCharacter),
        Refused(name: "NUL in a name", fields: get + [("x-a\u{0}", "1")], refusal: .forbiddenCharacter),
        Refused(name: "CR LF in :path (a request smuggled after it)",
                fields: [(":method", "GET"), (":scheme", "https"), (":path", "/ HTTP/1.1\r\nhost: a\r\n\r\nGET /admin"), (":authority", "a")],
                refusal: .forbiddenCharacter),
        Refused(name: "CR LF in :authority", fields: [(":method", "GET"), (":scheme", "https"), (":path", "/"), (":authority", "a\r\nx-auth-user: admin")],
                refusal: .forbiddenCharacter),
        Refused(name: "another control character in a value", fields: get + [("x-a", "a\u{1}b")], refusal: .invalidValue),
        Refused(name: "DEL in a value", fields: get + [("x-a", "a\u{7F}b")], refusal: .invalidValue),
        Refused(name: "a leading space in a value", fields: get + [("x-a", " 1")], refusal: .surroundingWhitespace),
        Refused(name: "a trailing space in a value", fields: get + [("x-a", "1 ")], refusal: .surroundingWhitespace),
        Refused(name: "a trailing tab in a value", fields: get + [("x-a", "1\t")], refusal: .surroundingWhitespace),
        Refused(name: "an empty name", fields: get + [("", "1")], refusal: .invalidName),
        Refused(name: "a name with a colon (would split into another name and value)", fields: get + [("x-a:x-auth-user", "admin")], refusal: .invalidName),
        Refused(name: "a name with a space", fields: get + [("x a", "1")], refusal: .invalidName),
        Refused(name: "a name with a non-ASCII letter", fields: get + [("x-\u{E9}", "1")], refusal: .invalidName),
        Refused(name: ":authority and host disagreeing", fields: get + [("host", "evil.example.com")], refusal: .authorityHostMismatch),
        Refused(name: ":authority and host with different ports", fields: get + [("host", "app.example.com:8443")], refusal: .authorityHostMismatch),
        Refused(name: "neither :authority nor host", fields: [(":method", "GET"), (":scheme", "https"), (":path", "/")], refusal: .missingAuthority),
        Refused(name: "two host fields without :authority", fields: [(":method", "GET"), (":scheme", "https"), (":path", "/"), ("host", "a"), ("host", "b")],
                refusal: .invalidAuthority),
        Refused(name: ":authority with userinfo", fields: [(":method", "GET"), (":scheme", "https"), (":path", "/"), (":authority", "user@a")],
                refusal: .invalidAuthority),
        Refused(name: "content-length announcing a body on a HEADERS that ended the stream", fields: get + [("content-length", "5")],
                refusal: .contentLengthWithoutBody),
        Refused(name: "a signed content-length", fields: get + [("content-length", "+5")], endStream: false, refusal: .invalidContentLength),
        Refused(name: "an empty content-length", fields: get + [("content-length", "")], endStream: false, refusal: .invalidContentLength),
        Refused(name: "a list in content-length", fields: get + [("content-length", "5, 5")], endStream: false, refusal: .invalidContentLength),
        Refused(name: "two content-lengths that differ", fields: get + [("content-length", "5"), ("content-length", "6")], endStream: false,
                refusal: .invalidContentLength),
    ]

    @Test("a malformed header block is refused as a stream error, never made into a head", arguments: refused)
    func malformed(_ c: Refused) {
        let result = make(c.fields, endStream: c.endStream)
        guard case .failure(let refusal) = result else {
            Issue.record("\(c.name) was accepted: \((try? result.get()).map { String(buffer: $0.head.bytes) } ?? "")")
            return
        }
        #expect(refusal == c.refusal)
        #expect(refusal.isStreamError)
    }

    @Test("a GET becomes its HTTP/1.1 head: the request line from :method and :path, host from :authority, the fields in order")
    func get() throws {
        let text = try bytes(Self.get + [("accept", "*/*"), ("user-agent", "curl/8")])
        #expect(text == "GET /a?b=1 HTTP/1.1\r\nhost: app.example.com\r\naccept: */*\r\nuser-agent: curl/8\r\n\r\n")
        let head = try make(Self.get).get()
        #expect(head.body == .none)
        #expect(head.head.method == .GET)
        #expect(head.head.target == "/a?b=1")
        #expect(head.head.version == .http1_1)
    }

    @Test("a host field that names the :authority's host is dropped for the one host line")
    func agreeingHost() throws {
        #expect(try bytes(Self.get + [("host", "APP.example.com")]) == "GET /a?b=1 HTTP/1.1\r\nhost: app.example.com\r\n\r\n")
    }

    @Test("without :authority, the host field is the host line")
    func hostOnly() throws {
        let text = try bytes([(":method", "GET"), (":scheme", "http"), (":path", "/"), ("accept", "*/*"), ("host", "app")])
        #expect(text == "GET / HTTP/1.1\r\nhost: app\r\naccept: */*\r\n\r\n")
    }

    @Test("cookie fields are joined with '; ' into one line where the first was (RFC 9113 §8.2.3)")
    func cookies() throws {
        let text = try bytes(Self.get + [("cookie", "a=1"), ("accept", "*/*"), ("cookie", "__Host-sessiongate=s"), ("cookie", "b=2")])
        #expect(text == "GET /a?b=1 HTTP/1.1\r\nhost: app.example.com\r\ncookie: a=1; __Host-sessiongate=s; b=2\r\naccept: */*\r\n\r\n")
    }

    @Test("OPTIONS * is the one asterisk-form request")
    func optionsAsterisk() throws {
        #expect(try bytes([(":method", "OPTIONS"), (":scheme", "https"), (":path", "*"), (":authority", "a")]) == "OPTIONS * HTTP/1.1\r\nhost: a\r\n\r\n")
    }

    @Test("te: trailers is allowed (the HTTP/1 rules then remove it as hop-by-hop)")
    func teTrailers() throws {
        let head = try make(Self.get + [("te", "trailers")]).get()
        let inbound = try RequestHeaderRules(identityHeaders: []).inspect(head.head, peerTrusted: false).get()
        #expect(inbound.upstreamHeaders["te"] == [])
    }

    @Test("the body: none when HEADERS ended the stream, the content-length as sent, otherwise chunked", arguments: [
        ("END_STREAM, no content-length", [], true, HTTP2RequestHead.Body.none, ""),
        ("END_STREAM, content-length 0", [("content-length", "0")], true, .none, "content-length: 0\r\n"),
        ("a body with content-length", [("content-length", "12")], false, .length(12), "content-length: 12\r\n"),
        ("a body of content-length 0", [("content-length", "0")], false, .none, "content-length: 0\r\n"),
        ("two equal content-lengths", [("content-length", "3"), ("content-length", "3")], false, .length(3), "content-length: 3\r\ncontent-length: 3\r\n"),
        ("a body without content-length", [], false, .chunked, "transfer-encoding: chunked\r\n"),
    ] as [(String, [(String, String)], Bool, HTTP2RequestHead.Body, String)])
    func body(_ name: String, _ fields: [(String, String)], _ endStream: Bool, _ body: HTTP2RequestHead.Body, _ framing: String) throws {
        let post = [(":method", "POST"), (":scheme", "https"), (":authority", "a"), (":path", "/upload")]
        let head = try make(post + fields, endStream: endStream).get()
        #expect(head.body == body, "\(name)")
        #expect(String(buffer: head.head.bytes) == "POST /upload HTTP/1.1\r\nhost: a\r\n" + framing + "\r\n", "\(name)")
    }

    @Test("two equal content-lengths are refused by the HTTP/1 rules, as from an HTTP/1.1 client")
    func duplicateLengthThenHTTP1Rules() throws {
        let head = try make([(":method", "POST"), (":scheme", "https"), (":authority", "a"), (":path", "/"), ("content-length", "3"), ("content-length", "3")],
                            endStream: false).get()
        guard case .failure(.badRequest) = RequestHeaderRules(identityHeaders: []).inspect(head.head, peerTrusted: false) else {
            Issue.record("accepted")
            return
        }
    }

    @Test("a chunked body head frames its body as the HTTP/1 rules read it")
    func chunkedFraming() throws {
        let head = try make([(":method", "POST"), (":scheme", "https"), (":authority", "a"), (":path", "/")], endStream: false).get()
        let inbound = try RequestHeaderRules(identityHeaders: []).inspect(head.head, peerTrusted: false).get()
        #expect(inbound.framing == .chunked)
    }

    @Test("a head over server.limits is too large (431), not a stream error")
    func tooLarge() {
        let many = Self.get + (0..<20).map { ("x-\($0)", "v") }
        guard case .failure(let refusal) = make(many, maxFields: 10) else {
            Issue.record("accepted")
            return
        }
        #expect(!refusal.isStreamError)
        guard case .failure(let big) = make(Self.get + [("x-a", String(repeating: "v", count: 2000))], maxHeadBytes: 1024) else {
            Issue.record("accepted")
            return
        }
        #expect(big == .tooLarge("head larger than 1024 bytes"))
    }

    /// The spellings of identity headers the HTTP/1 tests use (`RequestHeaderRulesTests`): as an
    /// HTTP/2 client must send them, lower case.
    static let identitySpellings = [
        "X-Auth-User", "x-auth-user", "X-AUTH-USER", "X_Auth_User", "x_auth-user", "X-Auth_Email", "x-auth-name",
        "X-Auth-Role", "X-Auth-Groups", "x_auth_admin", "X-AUTH-ANYTHING", "X-User", "x_user",
        "Remote-User", "remote-user", "REMOTE-USER", "Remote_User", "REMOTE_USER", "remote_user", "Remote-Groups", "remote_groups",
        "Remote-Email", "Remote-Name", "X-Remote-User", "x-remote-user", "X_Remote_User", "X-Remote-Groups", "X-Remote-Email",
        "X-Remote-Name", "X-authentik-username", "X-Authentik-Groups", "X_AUTHENTIK_EMAIL", "X-authentik-uid", "X-authentik-jwt",
        "X-authentik-entitlements", "X-authentik-name", "X-WEBAUTH-USER", "x_webauth_user",
        "X-Forwarded-User", "X-Forwarded-Email", "X-Forwarded-Groups", "X-Forwarded-Preferred-Username", "x_forwarded_user",
    ]

    @Test("every identity-header spelling of the HTTP/1 tests is stripped from the head an HTTP/2 request makes, as from HTTP/1.1",
          arguments: identitySpellings)
    func identityStripped(_ spelling: String) throws {
        let rules = RequestHeaderRules(identityHeaders: ["X-Auth-User", "X-Auth-Email", "X-Auth-Name", "X-User"], identityPrefix: "X-Auth-")
        let head = try make(Self.get + [(spelling.lowercased(), "mallory"), ("accept", "*/*")]).get()
        for trusted in [false, true] {
            let inbound = try rules.inspect(head.head, peerTrusted: trusted).get()
            #expect(!inbound.upstreamHeaders.contains { $0.value == "mallory" }, "\(spelling), trusted: \(trusted)")
            #expect(inbound.upstreamHeaders["accept"] == ["*/*"])
        }
        // The same spelling as written, upper case and all: an HTTP/2 request that carries it is
        // malformed, and refused whole.
        if spelling != spelling.lowercased() {
            #expect(throws: HTTP2RequestRefusal.upperCaseName) { try make(Self.get + [(spelling, "mallory")]).get() }
        }
    }

    @Test("the session cookie is found in joined cookie fields, and removed from what goes upstream, as from HTTP/1.1")
    func hiddenCookieAcrossFields() throws {
        let rules = RequestHeaderRules(identityHeaders: [], hiddenCookies: ["__Host-sessiongate"])
        let head = try make(Self.get + [("cookie", "a=1"), ("cookie", "__Host-sessiongate=secret"), ("cookie", "b=2")]).get()
        let inbound = try rules.inspect(head.head, peerTrusted: false).get()
        #expect(inbound.upstreamHeaders["cookie"] == ["a=1; b=2"])
    }
}
