import AppleID
import Crypto
import Foundation
import HTTPProxy
import Logging
import NIOCore
import NIOHTTP1
import Sessions

/// The gateway's own endpoints under `server.auth_prefix` (DESIGN §1): sign-in page, web login
/// and callback, native sign-in, logout, userinfo, forward-auth check, assertion keys. Routed
/// for every host before any upstream route.
struct AuthEndpointGuard: RequestGuard {
    let auth: Authenticator
    /// Who may post to the state-changing endpoints (`server.public_url`,
    /// `server.allowed_origins`, the request's own host); from the running configuration.
    let origins: OriginPolicy

    static let maxFormBytes = 64 * 1024
    /// The state-changing endpoints a browser could be tricked into posting to. Not the
    /// callback (Apple's own cross-site POST, bound by state and the pre-auth cookie) and not
    /// Apple's notifications (server to server, signed).
    static let crossOriginChecked: Set<Substring> = ["/logout", "/revoke", "/native"]

    func admit(_ request: GuardRequest, on loop: any EventLoop) -> GuardDecision {
        let endpoint = request.target.path.dropFirst(auth.prefix.count)
        let method = request.head.method
        let query = request.target.query.flatMap { FormBody.parse(Array($0.utf8)) } ?? [:]
        let head = request.head
        if method == .POST, Self.crossOriginChecked.contains(endpoint),
           !origins.admits(origin: head.headers.first(name: "origin"), host: request.host) {
            // A page on another origin (a sibling subdomain is one) must not sign a user out,
            // disconnect them, or sign them in as someone else.
            return .verdict(.respond(.error(.forbidden, "cross-origin request refused", close: true)))
        }
        switch (endpoint, method) {
        case ("/sign-in", .GET), ("/sign-in", .HEAD):
            let rd = query["rd"].flatMap(auth.returnPolicy.validate) ?? "/"
            let message = query["message"]
            return .verdict(.respond(AuthResponses.html(.ok, AuthPages.signIn(loginURL: "\(auth.prefix)/login?rd=\(FormBody.escape(rd))", message: message))))
        case ("/login", .GET):
            return login(rd: query["rd"], head: head, on: loop)
        case ("/callback", .POST):
            return .verdict(.collectBody(maxBytes: Self.maxFormBytes) { body in
                loop.makeFutureWithTask { await callback(form: body, head: head, on: loop) }
            })
        case ("/native", .POST):
            return .verdict(.collectBody(maxBytes: Self.maxFormBytes) { body in
                loop.makeFutureWithTask { await native(body: body, head: head, on: loop) }
            })
        case ("/logout", .GET):
            // `rd`: the page the user signs out from; it picks the route's post_logout_redirect.
            let rd = query["rd"].flatMap(auth.returnPolicy.validate)
            let action = "\(auth.prefix)/logout" + (rd.map { "?rd=" + FormBody.escape($0) } ?? "")
            return .verdict(.respond(AuthResponses.html(.ok, AuthPages.confirmSignOut(action: action, stay: rd ?? "/"))))
        case ("/logout", .POST):
            let after = auth.afterLogout.target(from: query["rd"].flatMap(auth.returnPolicy.validate), host: request.host?.name)
            return .verdict(.collectBody(maxBytes: 4096) { _ in logout(head, redirect: after, on: loop) })
        case ("/userinfo", .GET):
            return resolved(head, on: loop) { resolution in
                switch resolution {
                case .session(_, let cached): return AuthResponses.json(.ok, Self.userJSON(cached.stored.user))
                case .anonymous, .invalid: return AuthResponses.json(.unauthorized, ["error": "unauthenticated"])
                case .unavailable: return AuthResponses.storeUnavailable(head)
                case .appleUnavailable: return AuthResponses.appleUnavailable(head, prefix: auth.prefix)
                }
            }
        case ("/check", .GET), ("/check", .HEAD):
            // Forward-auth (nginx auth_request, Traefik forwardAuth, Caddy forward_auth): 200
            // with the identity headers, or 401; never 2xx on any doubt.
            return resolved(head, on: loop) { resolution in
                switch resolution {
                case .session(let handle, let cached):
                    return LocalResponse(status: .ok, headers: [("cache-control", "no-store")] + auth.forwardHeaders(handle, cached, route: "check", on: loop))
                case .anonymous, .invalid:
                    // The front proxy answers 401 as it is to scripts, and sends browsers where
                    // this header says (nginx: auth_request_set; Caddy: handle_response).
                    let signIn = ForwardAuthRequest(head.headers, checkMethod: head.method.rawValue).signInURL(prefix: auth.prefix, policy: auth.returnPolicy)
                    return AuthResponses.json(.unauthorized, ["error": "unauthenticated"], headers: signIn.map { [(ForwardAuthRequest.signInHeader, $0)] } ?? [])
                case .unavailable: return AuthResponses.storeUnavailable(head)
                case .appleUnavailable: return AuthResponses.appleUnavailable(head, prefix: auth.prefix)
                }
            }
        case ("/apple/notifications", .POST):
            return .verdict(.collectBody(maxBytes: NotificationVerifier.maximumBodyBytes) { body in
                loop.makeFutureWithTask { await notification(body: body, on: loop) }
            })
        case ("/revoke", .POST):
            return .verdict(.collectBody(maxBytes: 4096) { _ in
                loop.makeFutureWithTask { await disconnect(head, on: loop) }
            })
        case ("/jwks.json", .GET):
            return .verdict(.respond(AuthResponses.json(.ok, auth.assertion?.jwks ?? ["keys": [Any]()])))
        case ("/sign-in", _), ("/login", _), ("/callback", _), ("/native", _), ("/logout", _), ("/userinfo", _), ("/check", _), ("/jwks.json", _),
             ("/apple/notifications", _), ("/revoke", _):
            return .verdict(.respond(.error(.methodNotAllowed, "\(method.rawValue) is not allowed here")))
        default:
            return .verdict(.respond(.error(.notFound, "no such endpoint")))
        }
    }

    private func resolved(_ head: HTTPRequestHead, on loop: any EventLoop, _ body: @escaping @Sendable (Resolution) -> LocalResponse) -> GuardDecision {
        switch auth.lookup(head.headers, on: loop) {
        case .now(let r): return .verdict(.respond(body(r)))
        case .later(let f): return .pending(f.map { .respond(body($0)) })
        }
    }

    // MARK: web sign-in

    /// Stores state and nonce server-side (10 minutes, single use), binds them to this browser
    /// with the pre-auth cookie, and sends the browser to Apple with `response_mode=form_post`.
    private func login(rd: String?, head: HTTPRequestHead, on loop: any EventLoop) -> GuardDecision {
        guard let apple = auth.apple else { return .verdict(.respond(Self.notConfigured())) }
        let returnTo = rd.flatMap(auth.returnPolicy.validate) ?? "/"
        let state = Self.randomToken()
        let nonce = Self.randomToken()
        let binding = Self.randomToken()
        let login = LoginState(nonce: nonce, returnTo: returnTo, binding: sha256Hex(binding), previousSession: presentedSession(head)?.key)
        let future = auth.withDeadline(auth.store.putLogin(state: state, login, ttl: 600_000, on: loop), on: loop).map { _ -> Verdict in
            let query = FormBody.encode([
                ("client_id", apple.webClientID), ("redirect_uri", auth.publicURL + auth.prefix + "/callback"),
                ("response_type", "code id_token"), ("response_mode", "form_post"), ("scope", auth.scopes.joined(separator: " ")),
                ("state", state), ("nonce", nonce),
            ])
            // Any session cookie the browser holds is cleared now: a cookie planted before the
            // login (fixation) never survives it; a real one is ended at the callback.
            return .respond(AuthResponses.redirect(.found, to: apple.baseURL + "/auth/authorize?" + query, headers: [
                ("set-cookie", "\(auth.loginCookieName)=\(binding); Path=/; Secure; HttpOnly; SameSite=None; Max-Age=600"),
                auth.clearCookie(auth.cookieName),
            ]))
        }.recover { _ in
            .respond(AuthResponses.html(.serviceUnavailable, AuthPages.message(
                title: "Sign in is unavailable", detail: "The gateway could not start your sign-in just now. Please try again in a moment.",
                action: ("Try again", auth.prefix + "/sign-in?rd=" + FormBody.escape(returnTo)))))
        }
        return .pending(future)
    }

    /// Apple's `form_post`: state and pre-auth cookie checked, the first-time `user` stored before
    /// anything else, the code exchanged, the identity token verified with the nonce, a new
    /// session issued (any cookie the browser had is replaced), then 303 to `rd`.
    private func callback(form body: ByteBuffer, head: HTTPRequestHead, on loop: any EventLoop) async -> LocalResponse {
        guard let apple = auth.apple else { return Self.notConfigured() }
        let clearLogin = auth.clearCookie(auth.loginCookieName, sameSiteNone: true)
        func fail(_ status: HTTPResponseStatus, _ title: String, _ detail: String, outcome: String, retry: String = "/") -> LocalResponse {
            auth.metrics.recordSignIn(flow: "web", outcome: outcome)
            return AuthResponses.html(status, AuthPages.message(title: title, detail: detail, action: ("Start again", auth.prefix + "/sign-in?rd=" + FormBody.escape(retry))),
                                      headers: [clearLogin])
        }
        guard let form = FormBody.parse(Array(body.readableBytesView)), let state = form["state"], !state.isEmpty else {
            return fail(.badRequest, "Sign in failed", "The response from Apple was incomplete.", outcome: "rejected")
        }
        guard let binding = Authenticator.cookie(auth.loginCookieName, in: head.headers) else {
            return fail(.badRequest, "Sign in failed", "No sign-in was started in this browser, or its cookies are blocked. Please start again.", outcome: "rejected")
        }
        let login: LoginState?
        do {
            login = try await auth.withDeadline(auth.store.takeLogin(state: state, on: loop), on: loop).get()
        } catch {
            return fail(.serviceUnavailable, "Sign in is unavailable", "Your sign-in could not be completed just now. Please try again.", outcome: "store_unavailable")
        }
        guard let login, IdentityTokenVerifier.constantTimeEqual(login.binding, sha256Hex(binding)) else {
            return fail(.badRequest, "Sign in expired", "This sign-in took too long, was already used, or was started in another browser.", outcome: "rejected")
        }
        if let error = form["error"] {
            if error == "user_cancelled_authorize" {
                auth.metrics.recordSignIn(flow: "web", outcome: "cancelled")
                return AuthResponses.redirect(.seeOther, to: auth.prefix + "/sign-in?message=cancelled&rd=" + FormBody.escape(login.returnTo), headers: [clearLogin])
            }
            // Attacker-controlled form data: only the characters Apple's error codes use reach the log.
            let code = String(error.prefix(64).filter { $0.isASCII && ($0.isLetter || $0 == "_") })
            auth.logger.warning("Apple answered the authorization with an error", metadata: ["error": "\(code)"])
            return fail(.badRequest, "Sign in failed", "Apple did not complete the sign-in.", outcome: "rejected", retry: login.returnTo)
        }
        guard let code = form["code"], !code.isEmpty else {
            return fail(.badRequest, "Sign in failed", "The response from Apple had no authorization code.", outcome: "rejected", retry: login.returnTo)
        }
        // The `user` JSON comes once, ever: keep it under the user before anything can fail.
        let name = form["user"].flatMap(Self.name(fromUserJSON:))
        if let token = form["id_token"] {
            do {
                let early = try await apple.verifier.verify(token, expectedNonce: login.nonce, code: code)
                if let name {
                    try await auth.withDeadline(auth.store.saveProfile(UserProfile(sub: early.subject, name: name), on: loop), on: loop).get()
                }
            } catch let rejection as AppleTokenRejection {
                return rejected(rejection, flow: "web", retry: login.returnTo, clear: clearLogin)
            } catch {
                return fail(.serviceUnavailable, "Sign in is unavailable", "Your sign-in could not be completed just now. Please try again.", outcome: "store_unavailable", retry: login.returnTo)
            }
        }
        let exchanged = await exchange(apple, code: code, clientID: apple.webClientID, redirectURI: auth.publicURL + auth.prefix + "/callback", nonce: login.nonce)
        let identity: AppleIdentity
        let refreshToken: String?
        switch exchanged {
        case .failure(let response):
            auth.metrics.recordSignIn(flow: "web", outcome: response.outcome)
            return AuthResponses.html(response.status, AuthPages.message(title: "Sign in failed", detail: response.detail,
                                                                          action: ("Start again", auth.prefix + "/sign-in?rd=" + FormBody.escape(login.returnTo))), headers: [clearLogin])
        case .success(let result):
            (identity, refreshToken) = result
        }
        do {
            let created = try await auth.createSession(identity: identity, refreshToken: refreshToken, name: name, on: loop).get()
            await endReplaced(login.previousSession.flatMap(SessionHandle.init(key:)), on: loop)
            auth.metrics.recordSignIn(flow: "web", outcome: "ok")
            auth.logger.info("signed in", metadata: ["flow": "web", "sub": "\(identity.subject)"])
            return AuthResponses.redirect(.seeOther, to: login.returnTo, headers: [auth.sessionCookie(created.cookie), clearLogin])
        } catch {
            auth.logger.warning("sign-in could not save the session", metadata: ["flow": "web", "error": "\(error)"])
            return fail(.serviceUnavailable, "Sign in is unavailable", "Your session could not be saved just now. Please try again.", outcome: "store_unavailable", retry: login.returnTo)
        }
    }

    // MARK: native sign-in

    /// `{identity_token, authorization_code, nonce?, user?}` → `{token, expires_at, user}`.
    private func native(body: ByteBuffer, head: HTTPRequestHead, on loop: any EventLoop) async -> LocalResponse {
        func fail(_ status: HTTPResponseStatus, _ error: String, _ message: String, outcome: String) -> LocalResponse {
            auth.metrics.recordSignIn(flow: "native", outcome: outcome)
            return AuthResponses.json(status, ["error": error, "message": message])
        }
        guard let apple = auth.apple else { return Self.notConfigured() }
        // A cross-site form can post `text/plain` that parses as JSON (login CSRF); a form
        // cannot send `application/json` without a CORS preflight.
        guard let type = head.headers.first(name: "content-type"), type.lowercased().hasPrefix("application/json") else {
            return fail(.unsupportedMediaType, "invalid_request", "the body must be JSON (Content-Type: application/json)", outcome: "rejected")
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any] else {
            return fail(.badRequest, "invalid_request", "the body must be a JSON object", outcome: "rejected")
        }
        guard let idToken = object["identity_token"] as? String, !idToken.isEmpty,
              let code = object["authorization_code"] as? String, !code.isEmpty else {
            return fail(.badRequest, "invalid_request", "identity_token and authorization_code are required strings", outcome: "rejected")
        }
        let nonce = object["nonce"] as? String
        if object["nonce"] != nil, nonce == nil { return fail(.badRequest, "invalid_request", "nonce must be a string", outcome: "rejected") }
        let name = Self.name(fromUser: object["user"])
        let early: AppleIdentity
        do {
            early = try await apple.verifier.verify(idToken, expectedNonce: nonce)
        } catch {
            if error.isTransient { return fail(.badGateway, "apple_unavailable", "Apple's keys could not be fetched; retry", outcome: "apple_unavailable") }
            return fail(.unauthorized, "invalid_identity_token", "the identity token was rejected: \(error.rawValue)", outcome: "rejected")
        }
        // The code was issued to the app's own client id (the token's audience), no redirect_uri.
        let identity: AppleIdentity
        let refreshToken: String?
        switch await exchange(apple, code: code, clientID: early.audience, redirectURI: nil, nonce: nonce) {
        case .failure(let f):
            auth.metrics.recordSignIn(flow: "native", outcome: f.outcome)
            return AuthResponses.json(f.status, ["error": f.outcome, "message": f.detail])
        case .success(let result):
            (identity, refreshToken) = result
        }
        guard identity.subject == early.subject else {
            return fail(.unauthorized, "invalid_grant", "the authorization code belongs to another user", outcome: "rejected")
        }
        // The unsigned name is stored with the session, only once Apple exchanged this user's
        // own code: a replayed identity token alone cannot rename its owner. (An app whose
        // exchange failed still holds the name and sends it with its retry.)
        do {
            let created = try await auth.createSession(identity: identity, refreshToken: refreshToken, name: name, on: loop).get()
            await endReplaced(presentedSession(head), on: loop)
            auth.metrics.recordSignIn(flow: "native", outcome: "ok")
            auth.logger.info("signed in", metadata: ["flow": "native", "sub": "\(identity.subject)"])
            return AuthResponses.json(.ok, ["token": created.cookie, "expires_at": Self.iso8601(created.expiresAt), "user": Self.userJSON(created.user)],
                                      headers: [auth.sessionCookie(created.cookie)])
        } catch {
            auth.logger.warning("sign-in could not save the session", metadata: ["flow": "native", "error": "\(error)"])
            return fail(.serviceUnavailable, "store_unavailable", "the session store did not answer; retry", outcome: "store_unavailable")
        }
    }

    // MARK: the session a sign-in replaces

    /// The session a request presents (cookie or bearer, signature valid), live or not.
    private func presentedSession(_ head: HTTPRequestHead) -> SessionHandle? {
        guard case .value(let value) = auth.credential(head.headers) else { return nil }
        return auth.keys.handle(forCookie: value)
    }

    /// A new sign-in ends the session the browser or app had: one browser, one session. A
    /// store failure here is logged and does not fail the sign-in that already succeeded.
    private func endReplaced(_ handle: SessionHandle?, on loop: any EventLoop) async {
        guard let handle else { return }
        do {
            guard let stored = try await auth.withDeadline(auth.store.load(handle, on: loop), on: loop).get() else { return }
            try await auth.endSession(handle, sub: stored.session.sub, on: loop).get()
            auth.metrics.recordSessionEnded(reason: "replaced")
        } catch {
            auth.logger.warning("the session replaced by a new sign-in could not be ended", metadata: ["error": "\(error)"])
        }
    }

    // MARK: the code exchange, shared by both flows

    struct ExchangeFailure: Error {
        var status: HTTPResponseStatus
        var outcome: String
        var detail: String
    }

    /// Exchanges the code and verifies the identity token Apple returns with it.
    private func exchange(_ apple: AppleServices, code: String, clientID: String, redirectURI: String?, nonce: String?) async
        -> Result<(AppleIdentity, String?), ExchangeFailure> {
        let answer = await auth.metrics.timeAppleCall("token") { await apple.tokens.exchange(code: code, clientID: clientID, redirectURI: redirectURI) }
        auth.metrics.recordAppleCall(endpoint: "token", outcome: answer.metricLabel)
        switch answer {
        case .success(let tokens):
            guard let idToken = tokens.idToken else {
                return .failure(ExchangeFailure(status: .badGateway, outcome: "apple_unavailable", detail: "Apple's answer had no identity token. Please try again."))
            }
            do {
                let identity = try await apple.verifier.verify(idToken, expectedNonce: nonce)
                return .success((identity, tokens.refreshToken))
            } catch {
                return .failure(ExchangeFailure(status: error.isTransient ? .badGateway : .unauthorized, outcome: error.isTransient ? "apple_unavailable" : "rejected",
                                                detail: "Apple's identity token could not be verified (\(error.rawValue))."))
            }
        case .grantRevoked:
            return .failure(ExchangeFailure(status: .badRequest, outcome: "rejected", detail: "Apple refused the sign-in code: it expired or was already used."))
        case .clientMisconfigured(let error):
            auth.logger.error("Apple rejected our client configuration: check apple.team_id, key_id, private_key_file and client_ids (sessiongate check --online)",
                              metadata: ["error": "\(error)"])
            return .failure(ExchangeFailure(status: .badGateway, outcome: "apple_misconfigured", detail: "Sign in with Apple is misconfigured on this site; the operators have been alerted."))
        case .transient(let reason, _):
            auth.logger.warning("Apple unavailable during sign-in", metadata: ["reason": "\(reason)"])
            return .failure(ExchangeFailure(status: .badGateway, outcome: "apple_unavailable", detail: "Apple could not be reached. Please try again in a moment."))
        }
    }

    private func rejected(_ rejection: AppleTokenRejection, flow: String, retry: String, clear: (String, String)) -> LocalResponse {
        auth.metrics.recordSignIn(flow: flow, outcome: rejection.isTransient ? "apple_unavailable" : "rejected")
        return AuthResponses.html(rejection.isTransient ? .badGateway : .badRequest, AuthPages.message(
            title: "Sign in failed", detail: rejection.isTransient ? "Apple could not be reached. Please try again in a moment." : "Apple's identity token could not be verified.",
            action: ("Start again", auth.prefix + "/sign-in?rd=" + FormBody.escape(retry))), headers: [clear])
    }

    // MARK: logout

    private func logout(_ head: HTTPRequestHead, redirect: String, on loop: any EventLoop) -> EventLoopFuture<LocalResponse> {
        let done: LocalResponse = AuthResponses.wantsHTML(head)
            ? AuthResponses.redirect(.seeOther, to: redirect, headers: [auth.clearCookie(auth.cookieName)])
            : LocalResponse(status: .noContent, headers: [auth.clearCookie(auth.cookieName), ("cache-control", "no-store")])
        guard case .value(let value) = auth.credential(head.headers), let handle = auth.keys.handle(forCookie: value) else {
            return loop.makeSucceededFuture(done)
        }
        auth.cache.invalidate(handle)
        return auth.withDeadline(auth.store.load(handle, on: loop), on: loop).flatMap { stored -> EventLoopFuture<Void> in
            guard let stored else { return loop.makeSucceededVoidFuture() }
            return auth.endSession(handle, sub: stored.session.sub, on: loop)
        }.map { _ in
            auth.metrics.recordSessionEnded(reason: "logout")
            return done
        }.recover { _ in AuthResponses.storeUnavailable(head) }
    }

    // MARK: Apple's notifications and the user's disconnect

    /// `POST /_auth/apple/notifications` (apple-sign-in.md §8.4): verified, deduplicated by
    /// `jti` across the fleet, acted on, answered 200 — also for unknown users and types, so Apple
    /// stops retrying; 400 only when the payload cannot be verified.
    private func notification(body: ByteBuffer, on loop: any EventLoop) async -> LocalResponse {
        guard let apple = auth.apple else { return Self.notConfigured() }
        let event: AppleNotification
        do {
            event = try await apple.notifications.verify(body: Array(body.readableBytesView))
        } catch {
            auth.metrics.recordNotification(type: "unverified", result: "rejected")
            auth.logger.warning("Apple notification rejected", metadata: ["reason": "\(error.rawValue)"])
            // Keys unreachable: 503 so that Apple retries; anything else can never verify.
            return error.isTransient ? .error(.serviceUnavailable, "Apple's keys are unavailable; retry") : .error(.badRequest, "unverifiable notification: \(error.rawValue)")
        }
        let type: String
        switch event.kind {
        case .emailDisabled: type = "email-disabled"
        case .emailEnabled: type = "email-enabled"
        case .consentRevoked: type = "consent-revoked"
        case .accountDeleted: type = "account-deleted"
        case .unknown: type = "unknown"
        }
        do {
            if let jti = event.jti {
                // Apple redelivers: a jti is acted on once, fleet-wide (kept a week).
                let first = try await auth.withDeadline(auth.store.claim(.notification(jti: jti), ttl: 7 * 86_400_000, on: loop), on: loop).get()
                guard first else {
                    auth.metrics.recordNotification(type: type, result: "duplicate")
                    return LocalResponse(status: .ok)
                }
            }
            switch event.kind {
            case .consentRevoked, .accountDeleted:
                // Sessions, and with them the sealed refresh tokens, are deleted.
                _ = try await auth.revokeUser(event.subject, source: .appleNotification, on: loop).get()
            case .emailDisabled, .emailEnabled:
                let known = try await auth.withDeadline(auth.store.profile(of: event.subject, on: loop), on: loop).get() != nil
                if known {
                    let update = UserProfile(sub: event.subject, email: event.email, privateEmail: event.isPrivateEmail,
                                             emailForwarding: event.kind == .emailEnabled ? "enabled" : "disabled")
                    try await auth.withDeadline(auth.store.saveProfile(update, on: loop), on: loop).get()
                    auth.invalidateUser(event.subject, on: loop)
                }
            case .unknown(let name):
                auth.logger.info("Apple notification of an unknown type ignored", metadata: ["type": "\(name.prefix(64))"])
            }
        } catch {
            // Answer 503 so that Apple retries, and forget the jti so the retry is processed.
            if let jti = event.jti { auth.store.release(.notification(jti: jti), on: loop).whenFailure { _ in } }
            auth.logger.warning("Apple notification could not be processed", metadata: ["type": "\(type)", "error": "\(error)"])
            auth.metrics.recordNotification(type: type, result: "store_unavailable")
            return .error(.serviceUnavailable, "the session store did not answer; retry")
        }
        auth.metrics.recordNotification(type: type, result: "processed")
        return LocalResponse(status: .ok)
    }

    /// `POST /_auth/revoke`: the user disconnects Apple (or deletes their account). Each stored
    /// refresh token is revoked at Apple, then the user is revoked here; an Apple failure never
    /// blocks the local revocation.
    private func disconnect(_ head: HTTPRequestHead, on loop: any EventLoop) async -> LocalResponse {
        let resolution = (try? await auth.resolve(head.headers, on: loop).get()) ?? .unavailable
        guard case .session(_, let cached) = resolution else {
            if case .unavailable = resolution { return AuthResponses.storeUnavailable(head) }
            return AuthResponses.json(.unauthorized, ["error": "unauthenticated"])
        }
        let sub = cached.stored.user.sub
        if let apple = auth.apple, let sessions = try? await auth.withDeadline(auth.store.sessions(of: sub, on: loop), on: loop).get() {
            for session in sessions {
                guard let sealed = session.sealedRefreshToken, let token = auth.keys.open(sealed, for: session.handle) else { continue }
                let outcome = await auth.metrics.timeAppleCall("revoke") { await apple.tokens.revoke(token: token, isRefreshToken: true, clientID: session.clientID) }
                auth.metrics.recordAppleCall(endpoint: "revoke", outcome: outcome == .revoked ? "ok" : "failed")
                if outcome != .revoked {
                    auth.logger.warning("Apple did not confirm a token revocation; the local revocation proceeds", metadata: ["outcome": "\(outcome)"])
                }
            }
        }
        do {
            _ = try await auth.revokeUser(sub, source: .user, on: loop).get()
        } catch {
            return AuthResponses.storeUnavailable(head)
        }
        let clear = auth.clearCookie(auth.cookieName)
        return AuthResponses.wantsHTML(head)
            ? AuthResponses.redirect(.seeOther, to: auth.prefix + "/sign-in?message=disconnected", headers: [clear])
            : LocalResponse(status: .noContent, headers: [clear, ("cache-control", "no-store")])
    }

    // MARK: helpers

    static func notConfigured() -> LocalResponse {
        .error(.serviceUnavailable, "sign-in is not configured (add an apple: section)")
    }

    static func userJSON(_ user: UserProfile) -> [String: Any] {
        var u: [String: Any] = ["sub": user.sub]
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
        guard let user = value as? [String: Any], let n = user["name"] as? [String: Any] else { return nil }
        let parts = [n["firstName"] as? String, n["lastName"] as? String].compactMap { $0 }
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
