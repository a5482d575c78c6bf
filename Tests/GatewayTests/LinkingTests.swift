import Foundation
import GatewayConfig
import HTTPProxy
import NIOConcurrencyHelpers
import NIOPosix
import Sessions
import TestSupport
import Testing

@testable import Gateway

/// Linking an Apple identity to a legacy account (issue 14 §1): the links API, `X-Auth-Account`
/// on every request of a linked user, never from a client, and gone with a deletion.
@Suite("Account links", .serialized, .timeLimit(.minutes(2)))
struct LinkingTests {
    static let secret = String(repeating: "s3cr3t-", count: 6)

    static func with<Result>(store: SignInHarness.Store, _ body: (SignInHarness) async throws -> Result) async throws -> Result {
        setenv("SG_TEST_LINKS_SECRET", secret, 1)
        return try await SignInHarness.with(store: store, assertion: true, configure: { c in
            c.identity.linksSecretFile = SecretReference.parse("env:SG_TEST_LINKS_SECRET")
        }, body)
    }

    static func post(_ b: TestBrowser, _ json: String, method: HTTPMethodName = .POST, bearer: String? = secret) async throws -> TestBrowser.Response {
        var headers = [("accept", "application/json")]
        if let bearer { headers.append(("authorization", "Bearer \(bearer)")) }
        return try await b.request("/_auth/links", method: method == .POST ? .POST : .DELETE, headers: headers, json: json, sendCookies: false)
    }

    enum HTTPMethodName { case POST, DELETE }

    func seen(_ h: SignInHarness, _ name: String) -> [String] { h.upstream.stats.withLockedValue { $0.lastHeaders }[name] }

    @Test("the app links and unlinks; X-Auth-Account follows at once, in the assertion too; clients cannot send it", arguments: [SignInHarness.Store.memory, .redis])
    func linkAndUnlink(store: SignInHarness.Store) async throws {
        try await Self.with(store: store) { h in
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            let spoof = [("accept", "text/html"), ("X-Auth-Account", "admin"), ("x_auth_account", "admin")]
            #expect(try await browser.request("/x", headers: spoof).status == 200)
            #expect(seen(h, "x-auth-account").isEmpty, "unlinked: absent, whatever the client sent")

            let app = TestBrowser(gatewayOrigin: h.origin)
            #expect(try await Self.post(app, #"{"sub":"\#(sub)","account":"acct-1"}"#, bearer: nil).status == 401)
            #expect(try await Self.post(app, #"{"sub":"\#(sub)","account":"acct-1"}"#, bearer: "wrong").status == 401)
            #expect(try await Self.post(app, #"{"account":"acct-1"}"#).status == 400)
            #expect(try await Self.post(app, #"{"sub":"\#(sub)","account":"bad\u0001"}"#).status == 400)
            #expect(try await Self.post(app, #"{"sub":"\#(sub)","account":"acct-1"}"#).status == 200)

            #expect(try await browser.request("/x", headers: spoof).status == 200)
            #expect(seen(h, "x-auth-account") == ["acct-1"], "linked: the gateway's value only")
            let assertion = try #require(seen(h, "x-auth-assertion").first)
            #expect(try await Base64URLTest.verifiedClaims(assertion, gateway: browser)["account"] as? String == "acct-1")

            let other = h.simulator.createUser()
            let conflict = try await Self.post(app, #"{"sub":"\#(other)","account":"acct-1"}"#)
            #expect(conflict.status == 409 && conflict.body.contains("another Apple identity"))

            let unlinked = try await Self.post(app, #"{"sub":"\#(sub)"}"#, method: .DELETE)
            #expect(unlinked.status == 200 && unlinked.body.contains(#""unlinked":"acct-1""#))
            #expect(try await browser.request("/x").status == 200)
            #expect(seen(h, "x-auth-account").isEmpty)
            #expect(try await Self.post(app, #"{"sub":"\#(other)","account":"acct-1"}"#).status == 200, "the account is free again")
        }
    }

    @Test("require_link: an unlinked user goes to the app's link page (browsers) or gets 403 naming it; linked, the route opens")
    func requireLink() async throws {
        setenv("SG_TEST_LINKS_SECRET", Self.secret, 1)
        try await SignInHarness.with(store: .memory, configure: { c in
            c.identity.linksSecretFile = SecretReference.parse("env:SG_TEST_LINKS_SECRET")
            c.identity.linkURL = "/link-account"
            c.routes[c.routes.count - 1].requireLink = true  // the catch-all route
            c.routes.insert(.init(name: "linking", pathPrefix: "/link-account", upstream: c.routes[0].upstream, auth: .required), at: 0)
        }) { h in
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/link-account", as: sub)
            let page = try await browser.request("/orders?id=7")
            #expect(page.status == 302 && page.location == "/link-account?rd=%2Forders%3Fid%3D7", "\(page.status) \(page.location ?? "")")
            let sneaky = try await browser.request("//evil.example/x")
            #expect(sneaky.status == 302 && sneaky.location?.contains("%2F%2F") == false, "rd is the canonical path, never //host: \(sneaky.location ?? "")")
            let api = try await browser.request("/orders", headers: [("accept", "application/json")])
            #expect(api.status == 403 && api.body.contains("link_required") && api.body.contains("/link-account"))
            #expect(try await browser.request("/link-account").status == 200, "the link page itself is open to the unlinked user")
            #expect(try await Self.post(browser, #"{"sub":"\#(sub)","account":"acct-5"}"#).status == 200)
            #expect(try await browser.request("/orders?id=7").status == 200)
            #expect(seen(h, "x-auth-account") == ["acct-5"])
        }
    }

    @Test("require_link needs identity.link_url and a route that knows the user")
    func requireLinkConfiguration() {
        let base = "routes:\n  - name: app\n    upstream: \"http://127.0.0.1:9000\"\n    auth: public\n    require_link: true\n"
        let paths = Set(GatewayConfiguration.parse(yaml: base).errors.map(\.path))
        #expect(paths == ["routes[0].require_link"])
        let messages = GatewayConfiguration.parse(yaml: base).errors.map(\.message).joined(separator: " | ")
        #expect(messages.contains("identity.link_url") && messages.contains("auth: required or optional"), "\(messages)")
        let bad = "identity:\n  link_url: \"javascript:alert(1)\"\n" + base
        #expect(GatewayConfiguration.parse(yaml: bad).errors.contains { $0.path == "identity.link_url" })
        let lookup = "identity:\n  link_lookup_url: \"https://app.example.com/lookup\"\nroutes:\n  - name: app\n    upstream: \"http://127.0.0.1:9000\"\n    auth: public\n"
        #expect(GatewayConfiguration.parse(yaml: lookup).errors.map(\.path) == ["identity.link_lookup_url"], "needs the links secret")
    }

    @Test("link_lookup_url: a verified, non-relay email the app knows is linked at sign-in; relay emails are never sent; a silent app blocks nothing")
    func lookup() async throws {
        let asked = NIOLockedValueBox<[(authorization: String?, body: String)]>([])
        let down = NIOLockedValueBox(false)
        try await withTeardown(SimpleHTTPServer.start(host: "127.0.0.1", port: 0, group: MultiThreadedEventLoopGroup.singleton) { request in
            let body = String(buffer: request.body)
            asked.withLockedValue { $0.append((request.head.headers.first(name: "authorization"), body)) }
            if down.withLockedValue({ $0 }) { return SimpleResponse(status: .internalServerError, "down") }
            return body.contains("ada@example.org")
                ? SimpleResponse(contentType: "application/json", #"{"account":"legacy-17","email_verified":true}"#)
                : SimpleResponse(status: .notFound, "")
        }, stop: { await $0.close() }) { app in
            setenv("SG_TEST_LINKS_SECRET", Self.secret, 1)
            try await SignInHarness.with(store: .memory, configure: { c in
                c.identity.linksSecretFile = SecretReference.parse("env:SG_TEST_LINKS_SECRET")
                c.identity.linkLookupURL = "http://127.0.0.1:\(app.localAddress?.port ?? 0)/lookup"
            }) { h in

                let ada = h.simulator.createUser(email: "ada@example.org", privateEmail: false)
                let browser = TestBrowser(gatewayOrigin: h.origin)
                _ = try await browser.signIn(from: "/x", as: ada)
                #expect(try await browser.request("/x").status == 200)
                #expect(seen(h, "x-auth-account") == ["legacy-17"], "linked before the first request")
                let first = try #require(asked.withLockedValue { $0.first })
                #expect(first.authorization == "Bearer \(Self.secret)" && first.body.contains(ada))

                // Linked now: later sign-ins do not ask again.
                _ = try await TestBrowser(gatewayOrigin: h.origin).signIn(from: "/x", as: ada)
                #expect(asked.withLockedValue { $0.count } == 1)

                // A private relay address is never sent.
                let hidden = h.simulator.createUser(privateEmail: true)
                _ = try await TestBrowser(gatewayOrigin: h.origin).signIn(from: "/x", as: hidden)
                #expect(asked.withLockedValue { $0.count } == 1, "relay emails match no legacy account and are never sent")

                // An unknown email: 404, no link. The app down: the sign-in goes on.
                let bob = h.simulator.createUser(email: "bob@example.org", privateEmail: false)
                let b = TestBrowser(gatewayOrigin: h.origin)
                _ = try await b.signIn(from: "/x", as: bob)
                #expect(try await b.request("/x").status == 200)
                #expect(seen(h, "x-auth-account").isEmpty)
                down.withLockedValue { $0 = true }
                let carol = h.simulator.createUser(email: "carol@example.org", privateEmail: false)
                let c = TestBrowser(gatewayOrigin: h.origin)
                #expect(try await c.signIn(from: "/x", as: carol).callback?.status == 303)
                #expect(try await c.request("/x").status == 200)
                #expect(asked.withLockedValue { $0.count } == 3)
            }
        }
    }

    @Test("link_lookup_url: an answer that does not say the app verified the email links nothing; the user goes on unlinked, and the links API still links them")
    func lookupNeedsTheAppsVerification() async throws {
        // Per email, what the app answers: only the last says the app verified the address.
        let answers = [
            "absent@example.org": #"{"account":"legacy-1"}"#,
            "false@example.org": #"{"account":"legacy-2","email_verified":false}"#,
            "string@example.org": #"{"account":"legacy-3","email_verified":"true"}"#,
            "verified@example.org": #"{"account":"legacy-4","email_verified":true}"#,
        ]
        let asked = NIOLockedValueBox<Int>(0)
        try await withTeardown(SimpleHTTPServer.start(host: "127.0.0.1", port: 0, group: MultiThreadedEventLoopGroup.singleton) { request in
            let body = String(buffer: request.body)
            asked.withLockedValue { $0 += 1 }
            guard let answer = answers.first(where: { body.contains($0.key) })?.value else { return SimpleResponse(status: .notFound, "") }
            return SimpleResponse(contentType: "application/json", answer)
        }, stop: { await $0.close() }) { app in
            setenv("SG_TEST_LINKS_SECRET", Self.secret, 1)
            try await SignInHarness.with(store: .memory, configure: { c in
                c.identity.linksSecretFile = SecretReference.parse("env:SG_TEST_LINKS_SECRET")
                c.identity.linkLookupURL = "http://127.0.0.1:\(app.localAddress?.port ?? 0)/lookup"
            }) { h throws in  // (its only throwing calls are inside #expect)
                for (email, account) in [("absent@example.org", nil), ("false@example.org", nil), ("string@example.org", nil),
                                         ("verified@example.org", "legacy-4")] as [(String, String?)] {
                    let sub = h.simulator.createUser(email: email, privateEmail: false)
                    let browser = TestBrowser(gatewayOrigin: h.origin)
                    #expect(try await browser.signIn(from: "/x", as: sub).callback?.status == 303, "\(email): the sign-in goes on")
                    #expect(try await browser.request("/x").status == 200)
                    #expect(seen(h, "x-auth-account") == (account.map { [$0] } ?? []), "\(email)")
                    if account == nil {
                        // The app's own confirmation step (the links API) remains the way.
                        #expect(try await Self.post(browser, #"{"sub":"\#(sub)","account":"confirmed-\#(email)"}"#).status == 200)
                        #expect(try await browser.request("/x").status == 200)
                        #expect(seen(h, "x-auth-account") == ["confirmed-\(email)"], "\(email)")
                    }
                }
                #expect(asked.withLockedValue { $0 } == 4, "each was asked once")
            }
        }
    }

    @Test("the app's lookup answer links only with email_verified as a JSON true", arguments: [
        (#"{"account":"42","email_verified":true}"#, LinkLookup.Answer.account("42")),
        (#"{"email_verified":true,"account":"42","extra":[1]}"#, .account("42")),
        (#"{"account":"42"}"#, .unverified),
        (#"{"account":"42","email_verified":false}"#, .unverified),
        (#"{"account":"42","email_verified":"true"}"#, .unverified),
        (#"{"account":"42","email_verified":1}"#, .unverified),
        (#"{"account":"42","email_verified":null}"#, .unverified),
        (#"{"account":null,"email_verified":true}"#, .none),
        (#"{"account":42,"email_verified":true}"#, .none),
        (#"{}"#, .none), (#"[]"#, .none), ("not json", .none),
    ] as [(String, LinkLookup.Answer)])
    func lookupAnswers(body: String, answer: LinkLookup.Answer) {
        #expect(LinkLookup.answer(json: Data(body.utf8)) == answer, "\(body)")
    }

    @Test("Apple's claims decide whether an email is looked up at all: present, verified by Apple, not a private relay", arguments: [
        ("ada@example.org", true as Bool?, false as Bool?, true), ("ada@example.org", true, nil, true),
        ("ada@example.org", false, false, false), ("ada@example.org", nil, false, false),
        ("x@privaterelay.appleid.com", true, true, false), ("", true, false, false), (nil, true, false, false),
    ] as [(String?, Bool?, Bool?, Bool)])
    func lookupNeedsApplesVerification(email: String?, verified: Bool?, privateEmail: Bool?, asked: Bool) {
        #expect(LinkLookup.mayLookUp(email: email, verified: verified, privateEmail: privateEmail) == asked)
    }

    @Test("a disconnect or a consent revoked keeps the link (the user comes back to the same account); a deletion removes it; without identity.links.secret_file there is no links API")
    func deletionAndNoAPI() async throws {
        try await Self.with(store: .redis) { h in
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            #expect(try await Self.post(browser, #"{"sub":"\#(sub)","account":"acct-9"}"#).status == 200)
            #expect(try await browser.request("/_auth/revoke", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
            let loop = h.service.core.outbox.loop
            #expect(try await h.service.core.store.account(linkedTo: sub, on: loop).get() == "acct-9", "a disconnect keeps the link")
            let url = h.origin + "/_auth/apple/notifications"
            #expect(await h.simulator.sendNotification(.consentRevoked, sub: sub, to: url, retryDelays: []).status == 200)
            #expect(try await h.service.core.store.account(linkedTo: sub, on: loop).get() == "acct-9", "consent revoked keeps the link")
            #expect(await h.simulator.sendNotification(.accountDelete, sub: sub, to: url, retryDelays: []).status == 200)
            #expect(try await h.service.core.store.account(linkedTo: sub, on: loop).get() == nil, "a deletion removes it")
            #expect(try await Self.post(browser, #"{"sub":"another.1","account":"acct-9"}"#).status == 200, "the account is free")

            try await SignInHarness.with(store: .memory) { plain throws in  // (its only throwing call is inside #expect)
                #expect(try await Self.post(TestBrowser(gatewayOrigin: plain.origin), #"{"sub":"a.1","account":"x"}"#).status == 404)
            }
        }
    }
}
