import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

@testable import AppleID
@testable import AppleIDSimulator

@Suite("Simulator /auth/authorize (real HTTP)", .serialized)
struct AuthorizeTests {
    struct Answer {
        var status: Int
        var location: String?
        var body: String
    }

    static func with(autoConsent: String? = "", _ body: (TokenFixture, @Sendable (String) async throws -> Answer) async throws -> Void) async throws {
        try await TokenFixture.with { f in
            f.simulator.setFaults { $0.autoConsent = autoConsent }
            let noRedirects = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton), configuration: .init(redirectConfiguration: .disallow))
            let base = f.simulator.baseURL
            let send: @Sendable (String) async throws -> Answer = { target in
                let isPost = target.hasPrefix("POST ")
                var request = HTTPClientRequest(url: base + (isPost ? "/auth/authorize/consent" : target))
                if isPost {
                    request.method = .POST
                    request.headers.add(name: "content-type", value: "application/x-www-form-urlencoded")
                    request.body = .bytes(ByteBuffer(string: String(target.dropFirst(5))))
                }
                let response = try await noRedirects.execute(request, timeout: .seconds(5))
                let bytes = try await response.body.collect(upTo: 1 << 20)
                return Answer(status: Int(response.status.code), location: response.headers.first(name: "location"), body: String(buffer: bytes))
            }
            var failure: (any Error)? = nil
            do { try await body(f, send) } catch { failure = error }
            try? await noRedirects.shutdown()
            if let failure { throw failure }
        }
    }

    static let returnURL = TokenFixture.returnURL.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!

    static func authorize(_ extra: String, client: String = TokenFixture.web, redirect: String = returnURL) -> String {
        "/auth/authorize?client_id=\(client)&redirect_uri=\(redirect)&state=st-1&nonce=n-1&\(extra)"
    }

    @Test("the validation matrix: bad requests are answered 400 JSON, never redirected", arguments: [
        ("scope without form_post", "response_type=code&scope=email&response_mode=query", "invalid_request"),
        ("scope with the default mode", "response_type=code&scope=name", "invalid_request"),
        ("code id_token with query", "response_type=code%20id_token&response_mode=query", "invalid_request"),
        ("id_token alone", "response_type=id_token&response_mode=fragment", "invalid_request"),
        ("token", "response_type=token", "invalid_request"),
        ("unknown scope", "response_type=code&scope=phone&response_mode=form_post", "invalid_scope"),
        ("unknown response_mode", "response_type=code&response_mode=web_message", "invalid_request"),
        ("duplicated parameter", "response_type=code&state=again", "invalid_request"),
        ("duplicated once decoded", "response_type=code&%73tate=again", "invalid_request"),
    ])
    func refused(name: String, extra: String, error: String) async throws {
        try await Self.with { _, send in
            let answer = try await send(Self.authorize(extra))
            #expect(answer.status == 400, "\(name)")
            #expect(answer.location == nil, "\(name): never redirected")
            #expect(answer.body.contains(#""error":"\#(error)""#), "\(name): \(answer.body)")
        }
    }

    @Test("unknown client, unregistered return URL")
    func clientAndRedirect() async throws {
        try await Self.with { _, send in
            #expect(try await send(Self.authorize("response_type=code", client: "com.nobody")).body.contains("invalid_client"))
            let evil = "https%3A%2F%2Fevil.example%2Fcb"
            let answer = try await send(Self.authorize("response_type=code", redirect: evil))
            #expect(answer.status == 400)
            #expect(answer.body.contains("unauthorized_client"))
        }
    }

    @Test("query delivery: 302 with code and state, and the code exchanges at /auth/token")
    func queryDelivery() async throws {
        try await Self.with { f, send in
            let answer = try await send(Self.authorize("response_type=code"))
            #expect(answer.status == 302)
            let location = try #require(answer.location)
            #expect(location.hasPrefix(TokenFixture.returnURL + "?state=st-1&code=c"))
            let code = try #require(URLComponents(string: location)?.queryItems?.first { $0.name == "code" }?.value)
            guard case .success(let tokens) = await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) else {
                Issue.record("the authorize code did not exchange"); return
            }
            #expect(tokens.idToken != nil)
        }
    }

    @Test("fragment delivery with code id_token: the identity token carries the nonce")
    func fragmentDelivery() async throws {
        try await Self.with { f, send in
            let answer = try await send(Self.authorize("response_type=code%20id_token&response_mode=fragment"))
            let location = try #require(answer.location)
            #expect(location.hasPrefix(TokenFixture.returnURL + "#state=st-1&code="))
            let fragment = try #require(location.split(separator: "#").last)
            let idToken = try #require(fragment.split(separator: "&").first { $0.hasPrefix("id_token=") }).dropFirst("id_token=".count)
            let clock = f.clock
            let verifier = IdentityTokenVerifier(keySet: f.keySet, clientIDs: [TokenFixture.web], now: { clock.now })
            _ = try await verifier.verify(String(idToken), expectedNonce: "n-1")
        }
    }

    @Test("form_post delivery: an auto-submitting form; the user JSON only on the first authorization")
    func formPostAndUserOnce() async throws {
        try await Self.with { f, send in
            let sub = f.simulator.createUser(email: "jane@example.org", privateEmail: false, firstName: "Jane", lastName: "Appleseed")
            f.simulator.setFaults { $0.autoConsent = sub }
            let first = try await send(Self.authorize("response_type=code&scope=name%20email&response_mode=form_post"))
            #expect(first.status == 200)
            #expect(first.body.contains(#"<form method="post" action="https://app.example.com/_auth/callback">"#))
            #expect(first.body.contains(#"name="user" value="{&quot;email&quot;:&quot;jane@example.org&quot;,&quot;name&quot;:{&quot;firstName&quot;:&quot;Jane&quot;,&quot;lastName&quot;:&quot;Appleseed&quot;}}""#))
            let second = try await send(Self.authorize("response_type=code&scope=name%20email&response_mode=form_post"))
            #expect(second.body.contains(#"name="code""#))
            #expect(!second.body.contains(#"name="user""#))
            f.simulator.revokeConsent(sub: sub)
            let afterRevoke = try await send(Self.authorize("response_type=code&scope=email&response_mode=form_post"))
            #expect(afterRevoke.body.contains(#"name="user" value="{&quot;email&quot;:&quot;jane@example.org&quot;}""#))
        }
    }

    @Test("the consent page lists users; Cancel answers user_cancelled_authorize with the state")
    func consentAndCancel() async throws {
        try await Self.with(autoConsent: nil) { f, send in
            let sub = f.simulator.createUser(firstName: "Tim", lastName: "Tester")
            let page = try await send(Self.authorize("response_type=code"))
            #expect(page.status == 200)
            #expect(page.body.contains("Tim Tester"))
            #expect(page.body.contains(#"value="cancel""#))
            let form = "client_id=\(TokenFixture.web)&redirect_uri=\(Self.returnURL)&response_type=code&response_mode=query&scope=&state=st-1"
            let cancel = try await send("POST " + form + "&action=cancel")
            #expect(cancel.location == TokenFixture.returnURL + "?error=user_cancelled_authorize&state=st-1")
            let chosen = try await send("POST " + form + "&sub=\(sub)")
            #expect(chosen.location?.hasPrefix(TokenFixture.returnURL + "?state=st-1&code=") == true)
        }
    }
}
