import GatewayConfig
import NIOHTTP1
import Sessions
import Testing

@testable import Gateway

@Suite("Admission rules")
struct AdmissionRulesTests {
    @Test("identity header values never carry CR, LF or NUL; names are percent-encoded UTF-8")
    func headerValues() {
        let user = UserProfile(sub: "001.abc", name: "Zoë\r\nX-Auth-User: admin", email: "a@b.c\r\nX-Evil: 1", emailVerified: true,
                               privateEmail: false, emailForwarding: "enabled\u{0}", realUserStatus: 2)
        let headers = Authenticator.identityHeaders(user, names: IdentityHeaderNames(), now: 0)
        for (_, value) in headers {
            #expect(!value.utf8.contains { $0 == 0x0d || $0 == 0x0a || $0 == 0 }, "\(value)")
        }
        let byName = Dictionary(headers, uniquingKeysWith: { a, _ in a })
        #expect(byName["X-Auth-User"] == "001.abc")
        #expect(byName["X-Auth-Name"] == "Zo%C3%AB%0D%0AX-Auth-User%3A%20admin")
        #expect(byName["X-Auth-Email"] == nil, "an email with a line break is not forwarded at all")
        #expect(byName["X-Auth-Email-Forwarding"] == nil)
        #expect(byName["X-Auth-Email-Verified"] == "true" && byName["X-Auth-Private-Email"] == "false" && byName["X-Auth-Real-User-Status"] == "2")
    }

    @Test("every control character keeps an identity value off the wire, not only CR, LF and NUL", arguments: [
        "a\u{0B}b", "a\u{0C}b", "a\u{1B}[2Jb", "a\u{7F}b", "a\u{1F}b",
    ])
    func controlCharacters(email: String) {
        let headers = Authenticator.identityHeaders(UserProfile(sub: "001.abc", email: email), names: IdentityHeaderNames(), now: 0)
        #expect(!headers.contains { $0.0 == "X-Auth-Email" })
    }

    @Test("log values escape C0, DEL, C1 and the Unicode line separators", arguments: [
        ("a\nb", "\"a\\nb\""), ("a\u{85}b", "\"a\\u0085b\""), ("a\u{2028}b", "\"a\\u2028b\""), ("a\u{9B}b", "\"a\\u009bb\""), ("plain", "plain"),
    ])
    func logEscaping(value: String, logged: String) {
        #expect(LineLogHandler.textValue(value) == logged)
    }

    @Test("allow lists", arguments: [
        // users, emails, domains, sub, email, verified, expected
        ([], [], [], "u1", "a@example.com", true, true),
        (["u1"], [], [], "u1", nil, false, true),
        (["u1"], [], [], "u2", "a@example.com", true, false),
        ([], ["A@Example.com"], [], "u2", "a@example.com", true, true),
        ([], ["a@example.com"], [], "u2", "a@example.com", false, false),
        ([], [], ["example.com"], "u2", "a@example.com", true, true),
        ([], [], ["@example.com"], "u2", "a@EXAMPLE.com", true, true),
        ([], [], ["example.com"], "u2", "a@example.com", false, false),
        ([], [], ["example.com"], "u2", "a@evil.com@example.com", true, false),
        ([], [], ["example.com"], "u2", "a@sub.example.com", true, false),
        ([], [], ["example.com"], "u2", "@example.com", true, false),
        ([], [], ["example.com"], "u2", nil, true, false),
    ] as [([String], [String], [String], String, String?, Bool, Bool)])
    func allowLists(users: [String], emails: [String], domains: [String], sub: String, email: String?, verified: Bool, expected: Bool) {
        var allow = GatewayConfiguration.Allow()
        allow.users = users
        allow.emails = emails
        allow.emailDomains = domains
        #expect(AllowList(allow).admits(UserProfile(sub: sub, email: email, emailVerified: verified)) == expected)
    }

    @Test("allow lists across an app transfer: an entry naming the user's former sub matches", arguments: [
        // users, sub, former sub, expected
        (["old.1"], "new.1", "old.1", true),
        (["new.1"], "new.1", "old.1", true),
        (["old.2"], "new.1", "old.1", false),
        (["old.1"], "new.1", nil, false),
        (["new.1"], "old.1", nil, false),
    ] as [([String], String, String?, Bool)])
    func allowListsAfterTransfer(users: [String], sub: String, former: String?, expected: Bool) {
        var allow = GatewayConfiguration.Allow()
        allow.users = users
        #expect(AllowList(allow).admits(UserProfile(sub: sub, formerSub: former)) == expected)
    }

    @Test("return URLs", arguments: [
        ("/", "/"), ("/a/b?c=d#e", "/a/b?c=d#e"), ("https://app.example.com/x", "/x"), ("https://docs.example.com/g", "https://docs.example.com/g"),
        ("https://a.b.example.net/", "https://a.b.example.net/"), ("https://docs.example.com:8443/g", "https://docs.example.com:8443/g"),
        ("//evil.com", nil), ("/\\evil.com", nil), ("/%5Cevil.com", nil), ("/%2F/evil.com", nil), ("/%09/evil.com", nil), ("/\t/evil.com", nil),
        ("/./\\evil.com", nil), ("/.//evil.com", nil), ("/a/../../evil", nil), ("https://evil.com", nil), ("https://example.net/", nil),
        ("https://docs.example.com@evil.com/", nil), ("https://evil.com#@docs.example.com", nil), ("http://docs.example.com/", nil),
        ("javascript:alert(1)", nil), ("data:text/html,x", nil), ("https:/docs.example.com", nil), ("https://docs.example.com.evil.com/", nil),
        ("https://xexample.net/", nil), ("", nil), ("relative/path", nil), ("/%", nil), ("https://app.example.com//evil.com", nil),
    ] as [(String, String?)])
    func returnURLs(rd: String, expected: String?) {
        let policy = ReturnURLPolicy(origin: "https://app.example.com", allowedHosts: ["docs.example.com", ".example.net"])
        #expect(policy.validate(rd) == expected, "\(rd)")
    }

    @Test("forward-auth: which 401s send a browser to sign in, and where", arguments: [
        // (method, uri, accept, X-Requested-With, expected sign-in URL)
        ("GET", "/reports?q=1", "text/html,application/xhtml+xml", false, "/_auth/sign-in?rd=%2Freports%3Fq%3D1"),
        ("HEAD", "/reports", "text/html", false, "/_auth/sign-in?rd=%2Freports"),
        ("get", "/", "text/html", false, "/_auth/sign-in?rd=%2F"),
        ("GET", nil, "text/html", false, "/_auth/sign-in?rd=%2F"),
        ("GET", "//evil.example.com/x", "text/html", false, "/_auth/sign-in?rd=%2F"),
        ("GET", "https://evil.example.com/", "text/html", false, "/_auth/sign-in?rd=%2F"),
        ("GET", "/api/items", "application/json", false, nil),
        ("GET", "/api/items", "*/*", false, nil),
        ("GET", "/page", "text/html", true, nil),
        ("POST", "/form", "text/html", false, nil),
        ("DELETE", "/x", "text/html", false, nil),
    ] as [(String, String?, String, Bool, String?)])
    func forwardAuthSignIn(method: String, uri: String?, accept: String, requestedWith: Bool, expected: String?) {
        let request = ForwardAuthRequest(method: method, uri: uri, accept: [accept], requestedWith: requestedWith)
        #expect(request.signInURL(prefix: "/_auth", policy: ReturnURLPolicy(origin: "https://app.example.com", allowedHosts: [])) == expected)
    }

    @Test("forward-auth: the original request comes from Caddy's and nginx's headers")
    func forwardAuthHeaders() {
        let caddy = ForwardAuthRequest(["x-forwarded-method": "POST", "x-forwarded-uri": "/a", "accept": "text/html"])
        #expect(caddy == ForwardAuthRequest(method: "POST", uri: "/a", accept: ["text/html"]))
        let nginx = ForwardAuthRequest(["x-original-method": "GET", "x-original-uri": "/b?c", "x-requested-with": "XMLHttpRequest"])
        #expect(nginx == ForwardAuthRequest(method: "GET", uri: "/b?c", accept: [], requestedWith: true))
        #expect(ForwardAuthRequest([:], checkMethod: "HEAD").method == "HEAD")
    }

    @Test("post_logout_redirect: the route that covers rd decides, host-named routes first", arguments: [
        ("/app/reports?x=1", nil, "/app/bye"),
        ("/app", nil, "/app/bye"),
        ("/apple", nil, "https://www.example.com/"),
        ("/admin/x", nil, "/_auth/sign-in?message=signed_out"),
        ("/admin/x", "admin.example.com", "/admin-bye"),
        ("/elsewhere", "admin.example.com", "/_auth/sign-in?message=signed_out"),  // no route serves it on that host
        ("/elsewhere", "other.example.com", "https://www.example.com/"),
        (nil, nil, "/_auth/sign-in?message=signed_out"),
        ("https://docs.example.com/x", nil, "/_auth/sign-in?message=signed_out"),
    ] as [(String?, String?, String)])
    func postLogout(rd: String?, host: String?, expected: String) {
        func route(_ name: String, host: String? = nil, _ prefix: String, after: String?) -> GatewayConfiguration.Route {
            var r = GatewayConfiguration.Route(name: name, host: host, pathPrefix: prefix, upstream: UpstreamURL(host: "127.0.0.1", port: 1))
            r.postLogoutRedirect = after
            return r
        }
        let policy = PostLogoutPolicy([
            route("site", "/", after: "https://www.example.com/"), route("app", "/app", after: "/app/bye"), route("admin", "/admin/", after: nil),
            route("admin-host", host: "admin.example.com", "/admin", after: "/admin-bye"),
        ], signIn: "/_auth/sign-in?message=signed_out")
        #expect(policy.target(from: rd, host: host) == expected)
    }
}
