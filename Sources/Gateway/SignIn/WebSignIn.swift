import AppleID
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// The web flow (apple-sign-in.md §2): `/login` sends the browser to Apple, Apple posts back
/// to `/callback`.
extension AuthEndpointGuard {
    /// Stores state and nonce server-side (10 minutes, single use), binds them to this browser
    /// with the pre-auth cookie, and sends the browser to Apple with `response_mode=form_post`.
    /// Anonymous: within `apple.logins_per_minute` for `client` and `apple.max_pending_logins`
    /// for the instance, else a page saying when to try again, and nothing written.
    func login(rd: String?, head: HTTPRequestHead, client: String, on loop: any EventLoop) -> GuardDecision {
        guard let apple = core.apple else { return .verdict(.respond(Self.notConfigured())) }
        let returnTo = rd.flatMap(auth.returnPolicy.validate) ?? "/"
        do { try checkWrite(.login, client: client) } catch {
            return .verdict(.respond(error.page(startAgain: auth.signInPath(rd: returnTo))))
        }
        let state = Self.randomToken()
        let nonce = Self.randomToken()
        let binding = Self.randomToken()
        let login = LoginState(nonce: nonce, returnTo: returnTo, binding: sha256Hex(binding), previousSession: presentedSession(head)?.key)
        let future = core.store.putLogin(state: state, login, ttl: AnonymousWrites.lifetime, on: loop).map { _ -> Verdict in
            core.metrics.recordSignInStart(.login, outcome: .ok)
            let query = FormBody.encode([
                ("client_id", apple.webClientID), ("redirect_uri", auth.callbackURL),
                ("response_type", "code id_token"), ("response_mode", "form_post"), ("scope", auth.scopes.joined(separator: " ")),
                ("state", state), ("nonce", nonce),
            ])
            // Any session cookie the browser holds is cleared now: a cookie planted before the
            // login (fixation) never survives it; a real one is ended at the callback.
            return .respond(AuthResponses.redirect(.found, to: apple.baseURL + "/auth/authorize?" + query, headers: [
                ("set-cookie", "\(auth.loginCookieName)=\(binding); Path=/; Secure; HttpOnly; SameSite=None; Max-Age=600"),
                auth.clearCookie(auth.cookieName),
            ]))
        }.recover { _ -> Verdict in
            core.metrics.recordSignInStart(.login, outcome: .storeUnavailable)
            return .respond(AuthResponses.html(.serviceUnavailable, AuthPages.message(
                title: "Sign in is unavailable", detail: "The gateway could not start your sign-in just now. Please try again in a moment.",
                action: ("Try again", auth.signInPath(rd: returnTo)))))
        }
        return .pending(future)
    }

    /// Apple's `form_post`: state and pre-auth cookie checked, the first-time `user` stored before
    /// anything else, the code exchanged, the identity token verified with the nonce, a new
    /// session issued (any cookie the browser had is replaced), then 303 to `rd`.
    /// - Parameter client: the browser's address (`ClientAddress`): the exchange rate limit's key.
    func callback(form body: ByteBuffer, head: HTTPRequestHead, client: String, on loop: any EventLoop) async -> LocalResponse {
        guard let apple = core.apple else { return Self.notConfigured() }
        let clearLogin = auth.clearCookie(auth.loginCookieName, sameSiteNone: true)
        var returnTo = "/"
        do {
            guard let form = FormBody.parse(Array(body.readableBytesView)), let state = form["state"], !state.isEmpty else {
                throw SignInFailure.malformed("The response from Apple was incomplete.")
            }
            let login = try await takeLogin(state: state, head: head, on: loop)
            returnTo = login.returnTo
            if let error = form["error"] {
                guard error != "user_cancelled_authorize" else {
                    core.metrics.recordSignIn(flow: .web, outcome: .cancelled)
                    return AuthResponses.redirect(.seeOther, to: auth.signInPath(rd: login.returnTo, message: "cancelled"), headers: [clearLogin])
                }
                // Attacker-controlled form data: only the characters Apple's error codes use reach the log.
                let code = String(error.prefix(64).filter { $0.isASCII && ($0.isLetter || $0 == "_") })
                core.logger.warning("Apple answered the authorization with an error", metadata: ["error": "\(code)"])
                throw SignInFailure.appleDeclined
            }
            guard let code = form["code"], !code.isEmpty else { throw SignInFailure.malformed("The response from Apple had no authorization code.") }
            // The `user` JSON comes once, ever: keep it under the user before anything can fail.
            let name = form["user"].flatMap(Self.name(fromUserJSON:))
            if let token = form["id_token"] {
                let early: AppleIdentity
                do { early = try await apple.verifier.verify(token, expectedNonce: login.nonce, code: code) } catch { throw SignInFailure.identityToken(error) }
                if let name { try await storeCall { try await core.store.saveProfile(UserProfile(sub: early.subject, name: name), on: loop).get() } }
            }
            try checkRate(.web, key: ClientAddress.limitKey(client))
            let (identity, refreshToken) = try await exchange(apple, code: code, clientID: apple.webClientID, redirectURI: auth.callbackURL, nonce: login.nonce).get()
            await arriveByTransfer(identity, on: loop)
            let created = try await storeCall { try await auth.createSession(identity: identity, refreshToken: refreshToken, name: name, on: loop).get() }
            await lookUpLink(identity, on: loop)
            await endReplaced(login.previousSession.flatMap(SessionHandle.init(key:)), on: loop)
            core.metrics.recordSignIn(flow: .web, outcome: .ok)
            core.logger.info("signed in", metadata: ["flow": "web", "sub": "\(identity.subject)"])
            return AuthResponses.redirect(.seeOther, to: login.returnTo, headers: [auth.sessionCookie(created.cookie), clearLogin])
        } catch let failure as SignInFailure {
            return counted(failure, flow: .web).page(startAgain: auth.signInPath(rd: returnTo), clearing: clearLogin)
        } catch {
            return counted(.storeUnavailable, flow: .web).page(startAgain: auth.signInPath(rd: returnTo), clearing: clearLogin)
        }
    }

    /// The login this callback completes: its state taken (single use) and its pre-auth cookie
    /// matched.
    private func takeLogin(state: String, head: HTTPRequestHead, on loop: any EventLoop) async throws -> LoginState {
        guard let binding = Authenticator.cookie(auth.loginCookieName, in: head.headers) else { throw SignInFailure.loginNotStarted }
        let login = try await storeCall { try await core.store.takeLogin(state: state, on: loop).get() }
        guard let login, IdentityTokenVerifier.constantTimeEqual(login.binding, sha256Hex(binding)) else { throw SignInFailure.loginExpired }
        return login
    }

    /// Runs a store call; its failure is the sign-in's `storeUnavailable`.
    func storeCall<T>(_ body: () async throws -> T) async throws(SignInFailure) -> T {
        do { return try await body() } catch {
            core.logger.warning("sign-in could not use the session store", metadata: ["error": "\(error)"])
            throw .storeUnavailable
        }
    }
}
