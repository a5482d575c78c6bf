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
    /// On a routed host other than `public_url`'s, the login starts at `public_url`'s instead
    /// (`HostSignIn`); `bind` is the ticket binding such a host sent along.
    func login(rd: String?, bind: String?, host: RequestHost?, head: HTTPRequestHead, client: String, on loop: any EventLoop) -> GuardDecision {
        guard let apple = core.apple else { return .verdict(.respond(Self.notConfigured())) }
        let returnTo = rd.flatMap(auth.returnPolicy.validate) ?? "/"
        if let elsewhere = loginElsewhere(host: host, returnTo: returnTo) { return .verdict(.respond(elsewhere)) }
        do { try checkWrite(.login, client: client) } catch {
            return .verdict(.respond(error.page(startAgain: auth.signInPath(rd: returnTo))))
        }
        let state = Self.randomToken()
        let nonce = Self.randomToken()
        let binding = Self.randomToken()
        let login = LoginState(nonce: nonce, returnTo: returnTo, binding: sha256Hex(binding), previousSession: presentedSession(head)?.reference,
                               ticketBinding: ticketBinding(bind, returnTo: returnTo))
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
                ("set-cookie", "\(auth.loginCookieName)=\(binding); Path=/; Secure; HttpOnly; SameSite=None; Max-Age=\(Self.loginCookieLifetime)"),
                // Browsers that read SameSite=None as Strict (Safari on iOS 12 and macOS 10.14,
                // Chrome 51–66) drop the first on Apple's cross-site POST; they send this one,
                // which has no SameSite at all. Any other browser sends the first.
                ("set-cookie", "\(auth.legacyLoginCookieName)=\(binding); Path=/; Secure; HttpOnly; Max-Age=\(Self.loginCookieLifetime)"),
            ] + auth.clearSessionCookie()))
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
    /// session issued (any cookie the browser had is replaced), then 303 to `rd`. A callback that
    /// fails before the profile holds the first-time name leaves it sealed in the browser for the
    /// user's retry (`PendingName`).
    /// - Parameter client: the browser's address (`ClientAddress`): the exchange rate limit's key.
    func callback(form body: ByteBuffer, head: HTTPRequestHead, client: String, on loop: any EventLoop) async -> LocalResponse {
        guard let apple = core.apple else { return Self.notConfigured() }
        let clearLogin = [auth.clearCookie(auth.loginCookieName, sameSiteNone: true), auth.clearCookie(auth.legacyLoginCookieName)]
        let pending = Authenticator.cookie(auth.nameCookieName, in: head.headers)
        var returnTo = "/"
        var progress = CallbackProgress()
        do {
            guard let form = FormBody.parse(Array(body.readableBytesView)), let state = form["state"], !state.isEmpty else {
                throw SignInFailure.malformed("The response from Apple was incomplete.")
            }
            let login: LoginState
            do { login = try await takeLogin(state: state, head: head, on: loop) } catch let failure as LoginLookupFailure {
                // Whose callback this is cannot be told (the store down; or this browser's login
                // gone — the user spent over 10 minutes at Apple — while its pre-auth cookie
                // lives on); a verified identity token can still say whose name it carries:
                // Apple sends it once, ever.
                (progress.loginUnknown, progress.token, progress.code, progress.name) = (true, form["id_token"], form["code"], form["user"].flatMap(Self.name(fromUserJSON:)))
                throw failure.failure
            }
            returnTo = login.returnTo
            if let error = form["error"] {
                guard error != "user_cancelled_authorize" else {
                    core.metrics.recordSignIn(flow: .web, outcome: .cancelled)
                    return AuthResponses.redirect(.seeOther, to: auth.signInPath(rd: login.returnTo, message: "cancelled"), headers: clearLogin)
                }
                // Attacker-controlled form data: only the characters Apple's error codes use reach the log.
                let code = String(error.prefix(64).filter { $0.isASCII && ($0.isLetter || $0 == "_") })
                core.logger.warning("Apple answered the authorization with an error", metadata: ["error": "\(code)"])
                throw SignInFailure.appleDeclined
            }
            guard let code = form["code"], !code.isEmpty else { throw SignInFailure.malformed("The response from Apple had no authorization code.") }
            // The `user` JSON comes once, ever: keep it under the user before anything can fail.
            let name = form["user"].flatMap(Self.name(fromUserJSON:))
            (progress.loginVerified, progress.token, progress.code, progress.nonce, progress.name) = (true, form["id_token"], code, login.nonce, name)
            if let token = form["id_token"] {
                progress.tokenTried = true
                let early: AppleIdentity
                do { early = try await apple.verifier.verify(token, expectedNonce: login.nonce, code: code) } catch {
                    progress.keysUnavailable = error.isTransient
                    throw SignInFailure.identityToken(error)
                }
                progress.subject = early.subject
                let kept = name == nil ? await pendingName(pending, of: early.subject, on: loop) : nil
                if let known = name ?? kept {
                    try await storeCall { try await core.store.saveProfile(UserProfile(sub: early.subject, name: known), on: loop).get() }
                    progress.saved = true
                }
            }
            try checkRate(.web, key: ClientAddress.limitKey(client))
            let (identity, refreshToken) = try await exchange(apple, code: code, clientID: apple.webClientID, redirectURI: auth.callbackURL, nonce: login.nonce).get()
            await arriveByTransfer(identity, on: loop)
            // Already saved above when the early verification found it: not read a second time.
            let kept = name == nil && !progress.saved ? await pendingName(pending, of: identity.subject, on: loop) : nil
            let created = try await storeCall {
                try await auth.createSession(identity: identity, refreshToken: refreshToken, name: name ?? kept, on: loop).get()
            }
            await lookUpLink(identity, on: loop)
            await endReplaced(login.previousSession.flatMap(SessionHandle.init(reference:)), on: loop)
            core.metrics.recordSignIn(flow: .web, outcome: .ok)
            core.logger.info("signed in", metadata: ["flow": "web", "sub": "\(identity.subject)"])
            var headers = [auth.sessionCookie(created.cookie)] + clearLogin
            if pending != nil { headers.append(auth.clearCookie(auth.nameCookieName, sameSiteNone: true)) }  // the sign-in completed
            // Started on a routed host outside the cookie's domain: the session goes there by ticket.
            if let ticket = ticketRedirect(login, cookie: created.cookie) {
                return AuthResponses.redirect(.seeOther, to: ticket, headers: headers + [("referrer-policy", "no-referrer")])
            }
            return AuthResponses.redirect(.seeOther, to: login.returnTo, headers: headers)
        } catch let failure as SignInFailure {
            var page = counted(failure, flow: .web).page(startAgain: auth.signInPath(rd: returnTo), clearing: clearLogin)
            if let keep = await keepName(progress) { page.headers.append(keep) }
            return page
        } catch {
            var page = counted(.storeUnavailable, flow: .web).page(startAgain: auth.signInPath(rd: returnTo), clearing: clearLogin)
            if let keep = await keepName(progress) { page.headers.append(keep) }
            return page
        }
    }

    /// How far a callback got, for keeping the first-time name when it fails.
    struct CallbackProgress {
        /// The first-time name Apple sent with this callback.
        var name: String?
        /// The profile holds it.
        var saved = false
        /// The state and pre-auth cookie matched: this browser's own login.
        var loginVerified = false
        /// The store failed before the login state could be read.
        var loginUnknown = false
        var token: String?
        var code: String?
        var nonce: String?
        /// The identity token's verification was attempted.
        var tokenTried = false
        /// It failed only because Apple's keys could not be fetched (the token itself may be fine).
        var keysUnavailable = false
        /// The identity token's verified `sub`.
        var subject: String?
    }

    /// The `set-cookie` that keeps the first-time name of a failed callback (`PendingName`), or
    /// nil: no name, already stored, or no user it can be bound to. A callback whose login is
    /// not this browser's (no pre-auth cookie, another browser's state) keeps nothing; one whose
    /// login could not be read (the store down, or its state gone while the browser's pre-auth
    /// cookie lives) keeps the name only for the `sub` of an identity token that verifies.
    func keepName(_ p: CallbackProgress) async -> (String, String)? {
        guard let name = p.name, !p.saved, p.loginVerified || p.loginUnknown else { return nil }
        var sub = p.subject
        if sub == nil, let token = p.token {
            var uncheckable = p.keysUnavailable
            if !p.tokenTried, let apple = core.apple {
                do { sub = try await apple.verifier.verify(token, expectedNonce: p.nonce, code: p.code).subject } catch { uncheckable = error.isTransient }
            }
            // Only when the token could not be checked (Apple's keys unreachable), never when it
            // was refused: a forged token must not bind a name to someone else's `sub`.
            if sub == nil, p.loginVerified, uncheckable { sub = PendingName.unverifiedSubject(of: token) }
        }
        guard let sub, let sealed = PendingName.seal(name, sub: sub, nowMilliseconds: core.now(), keys: core.keys) else { return nil }
        return ("set-cookie", "\(auth.nameCookieName)=\(sealed); Path=/; Secure; HttpOnly; SameSite=None; Max-Age=\(PendingName.lifetime)")
    }

    /// The name a failed callback kept for `sub` in this browser, if any, and only while the
    /// user's profile holds none: a kept name completes a first sign-in, it never replaces a name.
    func pendingName(_ sealed: String?, of sub: String, on loop: any EventLoop) async -> String? {
        guard let name = sealed.flatMap({ PendingName.open($0, sub: sub, nowMilliseconds: core.now(), keys: core.keys) }) else { return nil }
        let stored = try? await core.store.profile(of: sub, on: loop).get()
        return stored?.name == nil ? name : nil
    }

    /// The login this callback completes: its state taken (single use) and its pre-auth cookie
    /// matched.
    /// Throws `LoginLookupFailure` when the login cannot be told (the store down, or its state
    /// gone while this browser holds a pre-auth cookie), else `SignInFailure`.
    private func takeLogin(state: String, head: HTTPRequestHead, on loop: any EventLoop) async throws -> LoginState {
        guard let binding = Authenticator.cookie(auth.loginCookieName, in: head.headers) ?? Authenticator.cookie(auth.legacyLoginCookieName, in: head.headers)
        else { throw SignInFailure.loginNotStarted }
        let found: LoginState?
        do { found = try await storeCall { try await core.store.takeLogin(state: state, on: loop).get() } } catch {
            throw LoginLookupFailure(failure: error)
        }
        guard let login = found else { throw LoginLookupFailure(failure: .loginExpired) }
        // Another browser's login (a stolen callback): nothing of it is kept.
        guard IdentityTokenVerifier.constantTimeEqual(login.binding, sha256Hex(binding)) else { throw SignInFailure.loginExpired }
        return login
    }

    /// A login this callback cannot be matched with, though the browser started one here.
    struct LoginLookupFailure: Error { var failure: SignInFailure }

    /// How long the pre-auth cookie lives (seconds): beyond the login state's 10 minutes, so that
    /// a callback after them still shows the browser started a login here (its first-time name
    /// is kept for the retry, `keepName`).
    static let loginCookieLifetime = 3600

    /// Runs a store call; its failure is the sign-in's `storeUnavailable`.
    func storeCall<T>(_ body: () async throws -> T) async throws(SignInFailure) -> T {
        do { return try await body() } catch {
            core.logger.warning("sign-in could not use the session store", metadata: ["error": "\(error)"])
            throw .storeUnavailable
        }
    }
}
