import AppleID
import Crypto
import Foundation
import GatewayConfig
import HTTPProxy
import Logging
import NIOCore
import NIOHTTP1
import Sessions

/// Routes a request under the auth prefix through the `AuthEndpoint` table. Routed for every
/// host before any upstream route.
struct AuthEndpointGuard: RequestGuard {
    /// This configuration generation's settings.
    let auth: Authenticator
    /// The process's parts (`auth.core`).
    var core: AuthCore { auth.core }
    /// Who may post to the state-changing endpoints (`server.public_url`,
    /// `server.allowed_origins`, the request's own host); from the running configuration.
    let origins: OriginPolicy
    /// `server.trusted_proxies`: behind one, a client is known by its `X-Forwarded-For` address.
    var trustedProxies: [CIDR] = []

    static let maxFormBytes = 64 * 1024

    func admit(_ request: GuardRequest, on loop: any EventLoop) -> GuardDecision {
        guard let endpoint = AuthEndpoint(path: request.target.path.dropFirst(auth.prefix.count)) else {
            return .verdict(.respond(.error(.notFound, "no such endpoint")))
        }
        let method = request.head.method
        guard endpoint.methods.contains(method) else {
            var refused = LocalResponse.error(.methodNotAllowed, "\(method.rawValue) is not allowed here")
            refused.headers.append(("allow", endpoint.methods.map(\.rawValue).joined(separator: ", ")))
            return .verdict(.respond(refused))
        }
        let head = request.head
        if method == .POST, endpoint.checksOrigin, !origins.admits(origin: head.headers.first(name: "origin"), host: request.host) {
            // A page on another origin (a sibling subdomain is one) must not sign a user out,
            // disconnect them, or sign them in as someone else.
            return .verdict(.respond(.error(.forbidden, "cross-origin request refused", close: true)))
        }
        let query = request.target.query.flatMap { FormBody.parse(Array($0.utf8)) } ?? [:]
        // Who the per-client limits count: the forwarded address behind a trusted proxy. Read
        // only by the endpoints that count (not by /check, the forward-auth path).
        let trustedProxies = self.trustedProxies
        func client() -> String {
            ClientAddress.resolve(peer: request.clientAddress?.ipAddress, forwardedFor: head.headers["x-forwarded-for"], trusted: trustedProxies)
        }
        switch endpoint {
        case .signIn:
            let rd = query["rd"].flatMap(auth.returnPolicy.validate) ?? "/"
            return .verdict(.respond(AuthResponses.html(.ok, AuthPages.signIn(loginURL: "\(auth.prefix)/login?rd=\(FormBody.escape(rd))", message: query["message"]))))
        case .login:
            return login(rd: query["rd"], bind: query["bind"], host: request.host, head: head, client: client(), on: loop)
        case .redeem:
            let host = request.host
            return .pending(loop.makeFutureWithTask { .respond(await redeem(query["ticket"], host: host, head: head, on: loop)) })
        case .callback:
            let client = client()
            return collect(Self.maxFormBytes, request, span: "sign_in.web", on: loop) { await callback(form: $0, head: head, client: client, on: loop) }
        case .native:
            return collect(Self.maxFormBytes, request, span: "sign_in.native", on: loop) { await native(body: $0, head: head, on: loop) }
        case .nativeNonce:
            let client = client()
            return collect(4096, request, span: "sign_in.native_nonce", on: loop) { await issueNonce(body: $0, client: client, on: loop) }
        case .logout where method == .GET:
            // `rd`: the page the user signs out from; it picks the route's post_logout_redirect.
            let rd = query["rd"].flatMap(auth.returnPolicy.validate)
            let action = "\(auth.prefix)/logout" + (rd.map { "?rd=" + FormBody.escape($0) } ?? "")
            return .verdict(.respond(AuthResponses.html(.ok, AuthPages.confirmSignOut(action: action, stay: rd ?? "/"), referrerPolicy: "same-origin")))
        case .logout:
            let after = auth.afterLogout.target(from: query["rd"].flatMap(auth.returnPolicy.validate), host: request.host?.name)
            return .verdict(.collectBody(maxBytes: 4096) { _ in logout(head, redirect: after, on: loop) })
        case .userinfo:
            return resolved(head, trace: request.trace, on: loop) { resolution in
                switch resolution {
                case .session(_, let cached): return AuthResponses.json(.ok, Self.userJSON(cached.stored.user, now: core.now()))
                case .anonymous: return AuthResponses.json(.unauthorized, ["error": "unauthenticated"])
                case .invalid(let ended): return AuthResponses.unauthenticatedJSON(ended: ended)
                case .unavailable: return AuthResponses.storeUnavailable(head)
                case .appleUnavailable: return AuthResponses.appleUnavailable(head, prefix: auth.prefix)
                }
            }
        case .check:
            // Forward-auth (nginx auth_request, Traefik forwardAuth, Caddy forward_auth): 200
            // with the identity headers, or 401; never 2xx on any doubt.
            let asked = ForwardAuthRequest(head.headers, checkMethod: head.method.rawValue)
            // The access log says who and what: the original request only as a trusted front
            // proxy tells it (anyone else could write any URI into our log), without its query
            // (no query string is ever logged).
            let original = ClientAddress.isTrusted(request.clientAddress?.ipAddress, trustedProxies)
                ? asked.uri.map { asked.method + " " + ($0.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? "") } : nil
            return resolved(head, trace: request.trace, on: loop) { resolution in
                var response: LocalResponse
                var user: String? = nil
                switch resolution {
                case .session(let handle, let cached):
                    user = cached.stored.session.sub
                    response = LocalResponse(status: .ok, headers: [("cache-control", "no-store")] + auth.forwardHeaders(handle, cached, route: "check", on: loop))
                case .anonymous, .invalid:
                    // The front proxy answers 401 as it is to scripts, and sends browsers where
                    // this header says (nginx: auth_request_set; Caddy: handle_response).
                    let signIn = asked.signInURL(prefix: auth.prefix, policy: auth.returnPolicy)
                    response = AuthResponses.json(.unauthorized, ["error": "unauthenticated"], headers: (signIn.map { [(ForwardAuthRequest.signInHeader, $0)] } ?? [])
                                                  + (resolution.ended.map { [(AuthResponses.sessionEndedHeader, $0.rawValue)] } ?? []))
                case .unavailable: response = AuthResponses.storeUnavailable(head)
                case .appleUnavailable: response = AuthResponses.appleUnavailable(head, prefix: auth.prefix)
                }
                response.subject = LocalResponse.LoggedSubject(user: user, original: original)
                return response
            }
        case .appleNotifications:
            return collect(NotificationVerifier.maximumBodyBytes, request, span: "notification.receive", on: loop) { await notification(body: $0, on: loop) }
        case .revoke:
            return collect(4096, request, span: "disconnect", on: loop) { _ in await endConsent(.disconnect, head, on: loop) }
        case .accountDelete where method == .GET:
            return .verdict(.respond(AuthResponses.html(.ok, AuthPages.confirmDeletion(action: "\(auth.prefix)/account/delete"), referrerPolicy: "same-origin")))
        case .accountDelete:
            return collect(4096, request, span: "account.delete", on: loop) { _ in await endConsent(.deletion, head, on: loop) }
        case .jwks:
            return .verdict(.respond(AuthResponses.json(.ok, auth.assertion?.jwks ?? ["keys": [Any]()])))
        case .links:
            return collect(4096, request, span: "links", on: loop) { await links(method, head: head, body: $0, on: loop) }
        }
    }

    /// Reads the body (at most `maxBytes`), then answers with `handler`: in a traced request, as
    /// a span named `span` under the request's, whose children are the store and Apple calls.
    private func collect(_ maxBytes: Int, _ request: GuardRequest, span: String, on loop: any EventLoop,
                         _ handler: @escaping @Sendable (ByteBuffer) async -> LocalResponse) -> GuardDecision {
        let scope = TraceScope(core.tracer, request.requestTrace)
        return .verdict(.collectBody(maxBytes: maxBytes) { body in
            loop.makeFutureWithTask { await TraceScope.with(scope) { await TraceScope.span(span) { await handler(body) } } }
        })
    }

    private func resolved(_ head: HTTPRequestHead, trace: TraceContext?, on loop: any EventLoop,
                          _ body: @escaping @Sendable (Resolution) -> LocalResponse) -> GuardDecision {
        switch auth.lookup(head.headers, trace: trace, on: loop) {
        case .now(let r): return .verdict(.respond(body(r)))
        case .later(let f): return .pending(f.map { .respond(body($0)) })
        }
    }

    // MARK: logout

    private func logout(_ head: HTTPRequestHead, redirect: String, on loop: any EventLoop) -> EventLoopFuture<LocalResponse> {
        let done: LocalResponse = AuthResponses.wantsHTML(head)
            ? AuthResponses.redirect(.seeOther, to: redirect, headers: auth.clearSessionCookie())
            : LocalResponse(status: .noContent, headers: auth.clearSessionCookie() + [("cache-control", "no-store")])
        guard let handle = presentedSession(head) else { return loop.makeSucceededFuture(done) }
        core.cache.invalidate(handle)
        // Ended, or held until the store takes it (refused here meanwhile): done either way.
        return loop.makeFutureWithTask {
            try await core.revocations.durably(.session(key: handle.key, sub: handle.sub), keep: auth.absoluteTimeout, on: loop)
            core.metrics.recordSessionEnded(reason: .logout)
            return done
        }.recover { _ in AuthResponses.storeUnavailable(head) }
    }

    // MARK: helpers

    static func notConfigured() -> LocalResponse {
        .error(.serviceUnavailable, "sign-in is not configured (add an apple: section)")
    }

    /// The session a request presents (cookie or bearer, signature valid), live or not.
    func presentedSession(_ head: HTTPRequestHead) -> SessionHandle? {
        guard case .session(let handle) = auth.presented(head.headers) else { return nil }
        return handle
    }

    /// - Parameter now: Unix ms; a transferred user's `former_sub` is given during the transfer
    ///   period after their mapping (as `X-Auth-Former-User`).
    static func userJSON(_ user: UserProfile, now: Int64) -> [String: Any] {
        var u: [String: Any] = ["sub": user.sub]
        if let v = user.formerSub(at: now) { u["former_sub"] = v }
        if let v = user.email { u["email"] = v }
        if let v = user.emailVerified { u["email_verified"] = v }
        if let v = user.privateEmail { u["is_private_email"] = v }
        if let v = user.name { u["name"] = v }
        if let v = user.emailForwarding { u["email_forwarding"] = v }
        if let v = user.realUserStatus { u["real_user_status"] = v }
        return u
    }

    /// The display name from Apple's first-time `user` JSON (unsigned: display only, bounded,
    /// control characters removed).
    static func name(fromUserJSON text: String) -> String? {
        guard text.utf8.count <= 4096, let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) else { return nil }
        return name(fromUser: object)
    }

    static func name(fromUser value: Any?) -> String? {
        if let text = value as? String { return name(fromUserJSON: text) }
        guard let user = value as? [String: Any] else { return nil }
        return name(fromParts: user["name"])
    }

    /// A name given in parts: Apple's web `user.name` (`firstName`, `lastName`), or what an app
    /// has as `ASAuthorizationAppleIDCredential.fullName`, a `PersonNameComponents` encoded by
    /// `JSONEncoder` (`givenName`, `middleName`, `familyName`; its other parts are not a name).
    static func name(fromParts value: Any?) -> String? {
        guard let n = value as? [String: Any] else { return nil }
        let keys = n["firstName"] != nil || n["lastName"] != nil ? ["firstName", "lastName"] : ["givenName", "middleName", "familyName"]
        let parts = keys.compactMap { n[$0] as? String }
        let cleaned = parts.joined(separator: " ").unicodeScalars.filter { !$0.properties.generalCategory.isControl }
        let text = String(String.UnicodeScalarView(cleaned)).trimmingCharacters(in: .whitespaces)
        return text.isEmpty ? nil : String(text.prefix(200))
    }

    static func randomToken() -> String {
        var rng = SystemRandomNumberGenerator()
        return Base64URL.encode((0..<32).map { _ in UInt8.random(in: .min ... .max, using: &rng) })
    }

    static func iso8601(_ milliseconds: Int64) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.string(from: Date(timeIntervalSince1970: TimeInterval(milliseconds) / 1000))
    }
}

private extension Unicode.GeneralCategory {
    var isControl: Bool { self == .control || self == .format || self == .lineSeparator || self == .paragraphSeparator }
}
