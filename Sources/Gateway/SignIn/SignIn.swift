import AppleID
import HTTPProxy
import NIOCore
import Sessions

/// What both sign-in flows share: the code exchange, the session a sign-in replaces, and the
/// one place a failure is counted.
extension AuthEndpointGuard {
    /// Counts a failed sign-in and hands the failure back (for the flow to answer).
    func counted(_ failure: SignInFailure, flow: SignInFlow) -> SignInFailure {
        core.metrics.recordSignIn(flow: flow, outcome: failure.outcome)
        switch failure {
        case .appleMisconfigured:
            core.logger.error("Apple rejected our client configuration: check apple.team_id, key_id, private_key_file and client_ids (sessiongate check --online)",
                              metadata: ["flow": "\(flow.rawValue)"])
        case .appleUnavailable, .storeUnavailable:
            core.logger.warning("sign-in failed on a dependency", metadata: ["flow": "\(flow.rawValue)", "outcome": "\(failure.outcome.rawValue)"])
        default:
            break
        }
        return failure
    }

    /// Exchanges the code and verifies the identity token Apple returns with it.
    func exchange(_ apple: AppleServices, code: String, clientID: String, redirectURI: String?, nonce: String?) async
        -> Result<(AppleIdentity, String?), SignInFailure> {
        let answer = await core.metrics.timeAppleCall(.token) { await apple.tokens.exchange(code: code, clientID: clientID, redirectURI: redirectURI) }
        core.metrics.recordAppleCall(endpoint: .token, outcome: answer.metricLabel)
        guard case .success(let tokens) = answer else { return .failure(answer.signInFailure ?? .appleUnavailable) }
        // Apple's answer without an identity token is not the documented JSON: transient.
        guard let idToken = tokens.idToken else { return .failure(.appleUnavailable) }
        do {
            return .success((try await apple.verifier.verify(idToken, expectedNonce: nonce), tokens.refreshToken))
        } catch {
            return .failure(.identityToken(error))
        }
    }

    /// `identity.link_lookup_url`: a user with no link whose verified, non-relay email the app
    /// knows, **and says it verified**, is linked to that account before the first request.
    /// Failures are logged; the sign-in goes on either way.
    func lookUpLink(_ identity: AppleIdentity, on loop: any EventLoop) async {
        guard let lookup = core.linkLookup, LinkLookup.mayLookUp(identity) else { return }
        do {
            guard try await core.store.account(linkedTo: identity.subject, on: loop).get() == nil else { return }
            let account: String
            switch await lookup.account(for: identity) {
            case .account(let found): account = found
            case .none: return
            case .unverified:
                core.logger.notice("link lookup: the app named an account without saying it verified that email (email_verified: true); no link made",
                                   metadata: ["sub": "\(identity.subject)"])
                return
            }
            guard Self.isAccountID(account) else {
                core.logger.warning("link lookup: the app answered an account id that cannot be a header value; no link made")
                return
            }
            switch try await core.store.link(identity.subject, to: account, on: loop).get() {
            case .linked:
                core.revocations.invalidateUser(identity.subject, on: loop)  // the user's other sessions, everywhere
                core.logger.info("account linked by lookup", metadata: ["sub": "\(identity.subject)"])
            case .conflict: core.logger.notice("link lookup: the account is linked to another Apple identity; no link made", metadata: ["sub": "\(identity.subject)"])
            }
        } catch {
            core.logger.warning("link lookup: the session store did not answer; no link made", metadata: ["error": "\(error)"])
        }
    }

    /// The 60 days after an app transfer: an identity token whose `transfer_sub` names a user
    /// `migrate import` loaded but did not map (a missed batch) maps them now, before the session
    /// is made, so that it carries their link, profile and allow-list entries, and the app is
    /// told `user.transferred`. Failures are logged; the sign-in goes on (a later sign-in maps them).
    func arriveByTransfer(_ identity: AppleIdentity, on loop: any EventLoop) async {
        guard let id = identity.transferSubject else { return }
        do {
            guard let record = try await core.store.transfer(id, on: loop).get(), record.to == nil else { return }
            // Each store call is bounded by store.timeout (the Redis client's command timeout).
            guard let outcome = try await TransferArrival.apply(record, to: identity.subject, email: identity.email, privateEmail: identity.isPrivateEmail == true,
                                                                exported: TransferLine.exported(in: record), store: core.store, at: core.now(), keep: auth.absoluteTimeout, on: loop) else { return }
            if let from = record.from { core.revocations.invalidateUser(from, on: loop) }
            guard !outcome.alreadyMapped else { return }
            core.events?.transferred(TransferredUser(sub: identity.subject, formerSub: record.from, transferSubject: id), reason: "sign_in")
            core.logger.info("transferred user mapped at sign-in", metadata: ["sub": "\(identity.subject)", "sessions_ended": .stringConvertible(outcome.sessionsEnded),
                                                                             "linked": "\(outcome.account != nil)"])
        } catch {
            core.logger.warning("transferred user not mapped: the session store did not answer", metadata: ["error": "\(error)"])
        }
    }

    /// A new sign-in ends the session the browser or app had: one browser, one session. A
    /// store failure here is logged and does not fail the sign-in that already succeeded.
    func endReplaced(_ handle: SessionHandle?, on loop: any EventLoop) async {
        guard let handle else { return }
        do {
            guard let stored = try await core.store.load(handle, on: loop).get() else { return }
            try await core.revocations.endSession(handle, sub: stored.session.sub, reason: .replaced, keep: auth.absoluteTimeout, on: loop).get()
            core.metrics.recordSessionEnded(reason: .replaced)
        } catch {
            core.logger.warning("the session replaced by a new sign-in could not be ended", metadata: ["error": "\(error)"])
        }
    }
}

extension AuthEndpointGuard {
    /// One more code exchange for `key` in this flow, or `throttled`.
    func checkRate(_ flow: SignInFlow, key: String) throws(SignInFailure) {
        let (limit, t) = (auth.exchangesPerMinute, core.now())
        if let wait = core.exchanges.withLockedValue({ $0.admit(flow.rawValue + " " + key, now: t, limit: limit) }) {
            core.logger.notice("sign-in exchanges over apple.exchanges_per_minute: refused", metadata: ["flow": "\(flow.rawValue)"])
            throw .throttled(retryAfter: wait)
        }
    }
}

extension AuthEndpointGuard {
    /// One more anonymous store write of `kind` (a login state, a native nonce) for `client`
    /// (`ClientAddress`), or the failure that refuses it before anything is written. Refusals
    /// are counted (`sessiongate_sign_in_starts_total`) and logged at debug only: a flood must
    /// not become a flood of log lines.
    func checkWrite(_ kind: AnonymousWrites.Kind, client: String) throws(SignInFailure) {
        let (t, perClient, perInstance) = (core.now(), auth.loginsPerMinute, auth.maxPendingLogins)
        let key = ClientAddress.limitKey(client)
        switch core.anonymousWrites.withLockedValue({ $0.admit(kind, client: key, now: t, perClient: perClient, perInstance: perInstance) }) {
        case .admitted:
            return
        case .throttled(let wait):
            core.metrics.recordSignInStart(kind, outcome: .throttled)
            core.logger.debug("sign-in starts over apple.logins_per_minute for a client: refused", metadata: ["endpoint": "\(kind.rawValue)"])
            throw .throttled(retryAfter: wait)
        case .busy(let wait):
            core.metrics.recordSignInStart(kind, outcome: .busy)
            core.logger.debug("sign-in starts over apple.max_pending_logins: refused", metadata: ["endpoint": "\(kind.rawValue)"])
            throw .busy(retryAfter: wait)
        }
    }
}
