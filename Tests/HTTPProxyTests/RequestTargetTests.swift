import Testing

@testable import HTTPProxy

@Suite("Request target canonicalization")
struct RequestTargetTests {
    struct Case: CustomTestStringConvertible, Sendable {
        let uri: String
        let path: String
        let query: String?
        var testDescription: String { uri }
        init(_ uri: String, _ path: String, query: String? = nil) {
            self.uri = uri
            self.path = path
            self.query = query
        }
    }

    @Test("canonical paths", arguments: [
        Case("/", "/"),
        Case("/a/b", "/a/b"),
        Case("/a/b/", "/a/b/"),
        Case("/a?x=1&y=%2F", "/a", query: "x=1&y=%2F"),
        Case("/public/../admin", "/admin"),
        Case("/public/%2e%2e/admin", "/admin"),
        Case("/public/%2E%2E/admin", "/admin"),
        Case("/public/.%2e/admin", "/admin"),
        Case("/a/./b", "/a/b"),
        Case("/a/b/..", "/a/"),
        Case("/a/b/.", "/a/b/"),
        Case("/../../etc/passwd", "/etc/passwd"),
        Case("//admin", "/admin"),
        Case("/public//admin", "/public/admin"),
        Case("/%61dmin", "/admin"),
        Case("/a%20b", "/a%20b"),
        Case("/a%7eb", "/a~b"),
        Case("/a%c3%a9", "/a%C3%A9"),
        Case("/a|b", "/a%7Cb"),
        Case("/a.txt", "/a.txt"),
        Case("/.well-known/x", "/.well-known/x"),
        Case("/a..b", "/a..b"),
        Case("http://example.com/x/../y?q", "/y", query: "q"),
        Case("http://EXAMPLE.com", "/"),
        Case("http://example.com./x", "/x"),
    ])
    func canonical(_ c: Case) throws {
        let target = try RequestTarget.parse(c.uri, host: RequestHost(name: "example.com")).get()
        #expect(target.path == c.path)
        #expect(target.query == c.query)
    }

    @Test("rejected targets", arguments: [
        ("/a%2fb", RequestTarget.Rejection.encodedSeparator),
        ("/a%2Fb", .encodedSeparator),
        ("/a%5cb", .encodedSeparator),
        ("/a%00b", .encodedSeparator),
        ("/a%23b", .encodedSeparator),
        ("/a\\b", .backslash),
        ("/a#frag", .fragment),
        ("/a?x#frag", .fragment),
        ("/admin;jsessionid=1", .semicolon),
        ("/public;/../admin", .semicolon),
        ("/admin%3Bx", .encodedDelimiter),
        ("/admin%3bx", .encodedDelimiter),
        ("/admin%3F/x", .encodedDelimiter),
        ("/admin%09", .controlCharacter),
        ("/admin%0d%0aX: y", .controlCharacter),
        ("/admin%7F", .controlCharacter),
        ("/a%zz", .badEscape),
        ("/a%2", .badEscape),
        ("*", .notOriginForm),
        ("example.com:443", .notOriginForm),
        ("http:http://x/admin", .notOriginForm),
        ("http://evil.com/admin", .foreignAuthority),
        ("http://example.com@evil.com/", .foreignAuthority),
        ("http://example.com:8080/", .foreignAuthority),
        ("http://example.com../", .foreignAuthority),
        ("/a\u{7f}", .controlCharacter),
    ])
    func rejected(uri: String, rejection: RequestTarget.Rejection) {
        #expect(throws: rejection) { try RequestTarget.parse(uri, host: RequestHost(name: "example.com")).get() }
    }

    @Test("the forwarded target is path plus the untouched query")
    func forwarded() throws {
        let target = try RequestTarget.parse("/x/../y?a=%2F..%2F&b", host: nil).get()
        #expect(target.forwarded == "/y?a=%2F..%2F&b")
    }
}
