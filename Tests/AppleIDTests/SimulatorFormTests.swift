import NIOCore
import NIOHTTP1
import Testing

@testable import AppleIDSimulator

/// The simulator's own `application/x-www-form-urlencoded` reader and writer, and its request
/// collector, without I/O. The reader is deliberately not the gateway's (`HTTPProxy.FormBody`):
/// these rows are what the simulated Apple accepts and refuses, whatever the gateway does.
@Suite("Simulator form encoding and request collection")
struct SimulatorFormTests {
    @Test("well-formed forms: their fields", arguments: [
        ("empty", "", [:]),
        ("two fields", "a=1&b=2", ["a": "1", "b": "2"]),
        ("%20 is a space", "scope=name%20email", ["scope": "name email"]),
        ("+ is a space, in names too", "a+b=c+d", ["a b": "c d"]),
        ("an escaped + is a plus; hex in either case", "%2B=%2b", ["+": "+"]),
        ("escaped separators are data", "%26=%3D", ["&": "="]),
        ("no = : the empty value", "flag", ["flag": ""]),
        ("= without a value", "a=", ["a": ""]),
        ("empty fields are skipped", "&a=1&&b=2&", ["a": "1", "b": "2"]),
        ("a raw = in a value is data", "a=b=c", ["a": "b=c"]),
        ("RFC 3986 query characters may be raw", "redirect_uri=https://app.example.com/cb?x=1;y=(2)!$'*,@~", ["redirect_uri": "https://app.example.com/cb?x=1;y=(2)!$'*,@~"]),
        ("the user JSON", "user=%7B%22name%22%3A%7B%22firstName%22%3A%22Jane%22%7D%7D", ["user": #"{"name":{"firstName":"Jane"}}"#]),
        ("UTF-8 escapes", "n=Ren%C3%A9e", ["n": "Renée"]),
    ] as [(String, String, [String: String])])
    func accepted(name: String, form: String, fields: [String: String]) {
        #expect(URLEncodedForm.parse(Array(form.utf8)) == .success(fields), "\(name)")
    }

    @Test("malformed forms: refused, with where and why", arguments: [
        ("a duplicated name (Apple: invalid_request)", "a=1&a=2", URLEncodedForm.Failure.duplicateName("a")),
        ("duplicated with the same value", "a=1&a=1", .duplicateName("a")),
        ("duplicated once decoded", "a=1&%61=2", .duplicateName("a")),
        ("duplicated through + and %20", "a+b=1&a%20b=2", .duplicateName("a b")),
        ("% at the end", "a=%", .badEscape(offset: 2)),
        ("% with one digit", "a=%4", .badEscape(offset: 2)),
        ("% with no hex", "a=%zz", .badEscape(offset: 2)),
        ("% with a sign (what integer parsing accepts)", "a=%+f", .badEscape(offset: 2)),
        ("% with a minus", "a=%-1", .badEscape(offset: 2)),
        ("% with a space", "a=% 1", .badEscape(offset: 2)),
        ("a raw space", "a=b c", .unescapedByte(0x20, offset: 3)),
        ("a raw non-ASCII byte", "a=é", .unescapedByte(0xC3, offset: 2)),
        ("a raw quote", #"a=x""#, .unescapedByte(0x22, offset: 3)),
        ("a raw <", "a=<b>", .unescapedByte(0x3C, offset: 2)),
        ("a raw #", "a=1#f", .unescapedByte(0x23, offset: 3)),
        ("a raw newline", "a=1\n", .unescapedByte(0x0A, offset: 3)),
        ("an escape that is not UTF-8", "a=1&b=%FF", .notUTF8(offset: 4)),
        ("a truncated UTF-8 sequence", "a=%C3", .notUTF8(offset: 0)),
        ("a value without a name", "=1", .emptyName(offset: 0)),
        ("a later value without a name", "a=1&=2", .emptyName(offset: 4)),
    ] as [(String, String, URLEncodedForm.Failure)])
    func refused(name: String, form: String, failure: URLEncodedForm.Failure) {
        #expect(URLEncodedForm.parse(Array(form.utf8)) == .failure(failure), "\(name)")
    }

    @Test("encoding: every byte but RFC 3986 unreserved escaped, and it reads back", arguments: [
        ("unreserved stays", [("state", "st-1"), ("code", "c.A_b~")], "state=st-1&code=c.A_b~"),
        ("a space is %20", [("scope", "name email")], "scope=name%20email"),
        ("a URL", [("redirect_uri", "https://a.example/cb")], "redirect_uri=https%3A%2F%2Fa.example%2Fcb"),
        ("separators and +", [("a+b", "&=")], "a%2Bb=%26%3D"),
        ("UTF-8", [("user", #"{"n":"é"}"#)], "user=%7B%22n%22%3A%22%C3%A9%22%7D"),
        ("nothing", [], ""),
    ] as [(String, [(String, String)], String)])
    func encoded(name: String, fields: [(String, String)], expected: String) {
        let text = URLEncodedForm.encode(fields)
        #expect(text == expected, "\(name)")
        let decoded = Dictionary(uniqueKeysWithValues: fields.map { ($0.0, $0.1) })
        #expect(URLEncodedForm.parse(Array(text.utf8)) == .success(decoded), "\(name): reads back")
    }

    @Test("the collector: a whole request, then a too-large one refused, then the next one whole")
    func collector() {
        var collector = SimulatorRequestCollector(maxBodyBytes: 8)
        let post = HTTPRequestHead(version: .http1_1, method: .POST, uri: "/auth/token")
        #expect(collector.receive(.end(nil)) == .wait, "an end without a head is ignored")
        #expect(collector.receive(.head(post)) == .wait)
        #expect(collector.receive(.body(ByteBuffer(string: "a=1&"))) == .wait)
        #expect(collector.receive(.body(ByteBuffer(string: "b=22"))) == .wait, "exactly the limit")
        #expect(collector.receive(.end(nil)) == .respond(post, ByteBuffer(string: "a=1&b=22")))

        #expect(collector.receive(.head(post)) == .wait)
        #expect(collector.receive(.body(ByteBuffer(string: "a=1&b=333"))) == .wait, "one byte over: read on, dropped")
        #expect(collector.receive(.body(ByteBuffer(string: "more"))) == .wait)
        #expect(collector.receive(.end(nil)) == .refuseTooLarge(post))

        let get = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/auth/keys")
        #expect(collector.receive(.head(get)) == .wait)
        #expect(collector.receive(.end(nil)) == .respond(get, ByteBuffer()), "the next request starts clean")
    }

    @Test("the request target: path and query", arguments: [
        ("/auth/authorize?client_id=x&state=1", "/auth/authorize", "client_id=x&state=1"),
        ("/auth/keys", "/auth/keys", ""),
        ("/auth/authorize?", "/auth/authorize", ""),
        ("/a?b?c", "/a", "b?c"),
    ])
    func target(uri: String, path: String, query: String) {
        let request = SimulatorRequest(head: HTTPRequestHead(version: .http1_1, method: .GET, uri: uri), body: ByteBuffer())
        #expect(request.path == path)
        #expect(request.query == query)
    }
}
