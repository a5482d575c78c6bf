import HTTPProxy
import Testing

/// `FormBody` reads the query strings and form bodies of the auth endpoints (the return URL, the
/// callback's `code`, `state` and `user`): an escape is exactly `%` and two hex digits, and the
/// decoded bytes are UTF-8, or the whole input is refused — never read one way here and another
/// way by the browser or the app.
@Suite("Form bodies and query strings")
struct FormBodyTests {
    @Test("an escape is % and two hex digits; anything else, or bytes that are not UTF-8, is refused", arguments: [
        ("a%2Fb", "a/b"), ("%C3%A9t%C3%A9", "été"), ("a+b", "a b"), ("%2b", "+"), ("", ""),
        ("%+f", nil), ("%-0", nil), ("%-1", nil), ("% f", nil), ("%0", nil), ("%", nil), ("%g0", nil),
        ("%ff", nil), ("%C3", nil), ("%C0%AF", nil), ("%ED%A0%80", nil),
    ] as [(String, String?)])
    func decode(input: String, expected: String?) {
        #expect(FormBody.decode(Array(input.utf8)[...]) == expected, "\(input)")
    }

    @Test("a form with a bad escape in any field is refused whole")
    func parse() {
        #expect(FormBody.parse(Array("code=abc&state=%2Bx".utf8)) == ["code": "abc", "state": "+x"])
        #expect(FormBody.parse(Array("code=abc&state=%+fx".utf8)) == nil)
        #expect(FormBody.parse(Array("code=a%FFb".utf8)) == nil)
    }
}
