import Testing

@testable import HTTPProxy

@Suite("Request host normalization")
struct RequestHostTests {
    @Test("normalized once: lower case, one trailing dot gone, port separated", arguments: [
        ("secure.example.test", "secure.example.test", nil),
        ("secure.example.test.", "secure.example.test", nil),
        ("SECURE.Example.Test.", "secure.example.test", nil),
        ("secure.example.test.:8443", "secure.example.test", 8443),
        ("a:1", "a", 1),
        ("a:65535", "a", 65535),
        ("127.0.0.1:8080", "127.0.0.1", 8080),
        ("[::1]", "[::1]", nil),
        ("[::1]:80", "[::1]", 80),
        ("[FE80::1]", "[fe80::1]", nil),
        ("under_score.internal", "under_score.internal", nil),
    ] as [(String, String, Int?)])
    func normalized(raw: String, name: String, port: Int?) throws {
        let host = try RequestHost.parse(raw).get()
        #expect(host.name == name)
        #expect(host.port == port)
    }

    @Test("malformed hosts are rejected", arguments: [
        ("", RequestHost.Rejection.emptyName),
        (".", .emptyName),
        ("..", .emptyLabel),
        (".a", .emptyLabel),
        ("a..b", .emptyLabel),
        ("a.b..", .emptyLabel),
        (":80", .emptyName),
        ("a:b:c", .badPort),
        ("example.com.:1.2", .badPort),
        ("a:", .badPort),
        ("a:0", .badPort),
        ("a:65536", .badPort),
        ("a:123456", .badPort),
        ("a:+80", .badPort),
        ("a b", .badCharacter),
        ("a/b", .badCharacter),
        ("user@a", .badCharacter),
        ("a\\b", .badCharacter),
        ("a%2eb", .badCharacter),
        ("[::1", .badIPv6),
        ("[]", .badIPv6),
        ("[::1]x", .badIPv6),
        ("[::1]:", .badPort),
        ("[g::1]", .badIPv6),
        ("[1.2.3.4]", .badIPv6),
    ] as [(String, RequestHost.Rejection)])
    func rejected(raw: String, rejection: RequestHost.Rejection) {
        #expect(throws: rejection) { try RequestHost.parse(raw).get() }
    }

    @Test("authority: what the upstream receives as Host")
    func authority() throws {
        #expect(try RequestHost.parse("App.Example.COM.:8080").get().authority == "app.example.com:8080")
        #expect(try RequestHost.parse("[::1]").get().authority == "[::1]")
    }
}

@Suite("Origin policy for WebSockets and the gateway's POSTs")
struct OriginPolicyTests {
    let policy = OriginPolicy(allowedOrigins: ["https://app.example.com", "https://partner.example.org:8443/"])

    @Test(arguments: [
        ("no Origin (native app, curl)", nil, "gw.example.com", true),
        ("the request's own host, https", "https://gw.example.com", "gw.example.com", true),
        ("the request's own host, http", "http://gw.example.com", "gw.example.com", true),
        ("own host with its port", "http://localhost:8080", "localhost:8080", true),
        ("own host, trailing dot in Host", "https://gw.example.com", "gw.example.com.", true),
        ("own host, case", "https://GW.example.com", "gw.example.com", true),
        ("public_url", "https://app.example.com", "gw.example.com", true),
        ("public_url with its default port", "https://app.example.com:443", "gw.example.com", true),
        ("allowed origin with a port", "https://partner.example.org:8443", "gw.example.com", true),
        ("sibling subdomain (same site)", "https://evil.example.com", "gw.example.com", false),
        ("parent domain", "https://example.com", "gw.example.com", false),
        ("own host, other port", "http://localhost:9999", "localhost:8080", false),
        ("allowed origin, other scheme", "http://app.example.com", "gw.example.com", false),
        ("allowed origin, other port", "https://partner.example.org", "gw.example.com", false),
        ("null", "null", "gw.example.com", false),
        ("garbage", "javascript:alert(1)", "gw.example.com", false),
        ("userinfo", "https://app.example.com@evil.com", "gw.example.com", false),
        ("with a path", "https://gw.example.com/x", "gw.example.com", false),
        ("no Host to compare with", "https://gw.example.com", nil, false),
    ] as [(String, String?, String?, Bool)])
    func admits(_ name: String, origin: String?, host: String?, expected: Bool) throws {
        let requestHost = try host.map { try RequestHost.parse($0).get() }
        #expect(policy.admits(origin: origin, host: requestHost) == expected, "\(name)")
    }
}

@Suite("Header values the gateway writes")
struct HeaderValueTests {
    @Test(arguments: [
        ("plain", "Ada Lovelace", true),
        ("UTF-8 stays", "Zoë", true),
        ("tab is allowed", "a\tb", true),
        ("CR", "a\rb", false),
        ("LF", "a\nb", false),
        ("NUL", "a\u{0}b", false),
        ("vertical tab", "a\u{0B}b", false),
        ("form feed", "a\u{0C}b", false),
        ("escape", "a\u{1B}[31mb", false),
        ("unit separator", "a\u{1F}b", false),
        ("DEL", "a\u{7F}b", false),
    ] as [(String, String, Bool)])
    func safe(_ name: String, value: String, expected: Bool) {
        #expect(HTTPWire.isSafeValue(value) == expected, "\(name)")
    }
}
