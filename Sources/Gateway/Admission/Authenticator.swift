import AppleID
import Crypto
import Foundation
import GatewayConfig
import HTTPProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Sessions

/// A session as the hot path keeps it in the local cache: the stored session, without its sealed
/// refresh token (`SessionRecord.withoutToken`, read again when a re-validation is due). At
/// 100,000 sessions every byte here is 100 kB: the identity headers are built per request, and
/// the assertion is a reference.
struct CachedSession {
    var stored: StoredSession
    /// The last assertion signed, for one route (when assertions are enabled).
    var assertion: SignedAssertion? = nil
}

/// An identity assertion as signed for a route, under one configuration generation.
final class SignedAssertion: Sendable {
    let route: String
    let token: String
    /// Unix seconds.
    let expires: Int64
    let generation: Int

    init(route: String, token: String, expires: Int64, generation: Int) {
        self.route = route
        self.token = token
        self.expires = expires
        self.generation = generation
    }
}

/// What a request's credential turned out to be.
enum Resolution {
    /// No cookie, no bearer token.
    case anonymous
    /// A credential that names no live session: forged or ambiguous (nil), or a session that
    /// ended (why, as its client is told).
    case invalid(SessionEnd?)
    case session(SessionHandle, CachedSession)
    /// The store did not answer in time: 503, the cookie kept.
    case unavailable
    /// Apple could not confirm the session for longer than `apple.outage_grace`: 503.
    case appleUnavailable

    /// Why the session the credential named ended (`invalid`); nil otherwise.
    var ended: SessionEnd? {
        if case .invalid(let end) = self { end } else { nil }
    }
}

/// Sign-in and admission under one configuration generation: the settings a reload may change
/// (identity header names, auth prefix, public URL, return-URL policy, session lifetimes,
/// assertion issuer and lifetime, Apple scopes) over the process's `AuthCore`. A reload makes a
/// new one and swaps it with the routes, as one value (`GatewayService.reload`).
final class Authenticator: Sendable {
    let core: AuthCore
    /// Counts reloads; a cached assertion signed under another generation is signed again.
    let generation: Int
    let names: IdentityHeaderNames
    let cookieName: String
    /// `cookieName=`, for scanning `Cookie` headers (their bytes).
    let cookieMarker: [UInt8]
    /// The pre-auth cookie binding a login to one browser (`SameSite=None`).
    let loginCookieName: String
    /// The same without `SameSite`, for browsers that read `SameSite=None` as `Strict`.
    let legacyLoginCookieName: String
    let prefix: String
    let publicURL: String
    /// `public_url`'s host name (lower case, no port): where Apple posts back.
    let publicHost: String
    /// `session.cookie_domain`: the session cookie's `Domain` (nil: host-only).
    let cookieDomain: String?
    /// The routes' host names: the hosts a sign-in may start on and return to (`HostSignIn`).
    let routeHosts: Set<String>
    let returnPolicy: ReturnURLPolicy
    /// What a stored session is worth at an instant.
    let policy: SessionPolicy
    var times: SessionTimes { policy.times }
    /// Milliseconds.
    var idleTimeout: Int64 { times.idle }
    var absoluteTimeout: Int64 { times.absolute }
    let assertion: IdentityAssertionSigner?
    /// The scopes the web sign-in asks Apple for.
    let scopes: [String]
    /// Where a browser goes after signing out from a route.
    let afterLogout: PostLogoutPolicy
    /// `apple.native_nonce: required`.
    let nativeNonceRequired: Bool
    /// `apple.exchanges_per_minute` (0: none).
    let exchangesPerMinute: Int
    /// `apple.logins_per_minute` and `apple.max_pending_logins` (0: none).
    let loginsPerMinute: Int
    let maxPendingLogins: Int
    /// `identity.link_url`: where `require_link` routes send an unlinked user.
    let linkURL: String?

    /// A generation over an existing core: `c` may differ from the core's configuration only in
    /// keys `ReloadRules` lets a reload change.
    init(core: AuthCore, configuration c: GatewayConfiguration, generation: Int) throws {
        self.core = core
        self.generation = generation
        let publicURL = c.server.publicURL ?? "http://\(c.server.listen)"
        if let pem = core.secrets.assertionKeyPEM {
            assertion = try IdentityAssertionSigner(pem: pem, issuer: publicURL, ttl: Int64(c.identity.assertion.ttl.components.seconds))
        } else {
            assertion = nil
        }
        names = c.identity.headers
        cookieName = c.session.cookieName
        cookieMarker = Array((c.session.cookieName + "=").utf8)
        loginCookieName = c.session.cookieName + "-login"
        legacyLoginCookieName = c.session.cookieName + "-login-legacy"
        prefix = c.server.authPrefix
        self.publicURL = publicURL
        publicHost = GatewayConfiguration.hostName(ofOrigin: publicURL)
        cookieDomain = c.session.cookieDomain
        routeHosts = Set(c.routes.compactMap(\.host))
        returnPolicy = ReturnURLPolicy(origin: publicURL, allowedHosts: c.server.allowedRedirectHosts + routeHosts.sorted(),
                                       plainHTTPHosts: publicURL.hasPrefix("http://") ? routeHosts : [])
        policy = SessionPolicy(times: SessionTimes(idle: Self.milliseconds(c.session.idleTimeout), absolute: Self.milliseconds(c.session.absoluteTimeout)),
                               revalidation: core.revalidator?.times)
        scopes = c.apple?.scopes ?? []
        afterLogout = PostLogoutPolicy(c.routes, signIn: c.server.authPrefix + "/sign-in?message=signed_out")
        nativeNonceRequired = c.apple?.nativeNonce == .required
        exchangesPerMinute = c.apple?.exchangesPerMinute ?? 0
        loginsPerMinute = c.apple?.loginsPerMinute ?? 0
        maxPendingLogins = c.apple?.maxPendingLogins ?? 0
        linkURL = c.identity.linkURL
    }

    /// Apple's `redirect_uri` for the web flow: where Apple posts back, registered with the
    /// Services ID; the same string at `/login` and at the code exchange.
    var callbackURL: String { publicURL + prefix + "/callback" }

    /// The sign-in page, returning to `rd` (already validated) afterwards.
    func signInPath(rd: String, message: String? = nil) -> String {
        prefix + "/sign-in?" + (message.map { "message=" + $0 + "&" } ?? "") + "rd=" + FormBody.escape(rd)
    }

    static func milliseconds(_ d: Duration) -> Int64 {
        d.components.seconds * 1000 + d.components.attoseconds / 1_000_000_000_000_000
    }

    // MARK: lookup

    enum Lookup {
        case now(Resolution)
        case later(EventLoopFuture<Resolution>)
    }

    /// Cookie or bearer → signature → local cache → store (bounded by `store.timeout`) →
    /// timeouts → revocation. Synchronous on a cache hit. `trace`: the request's admission span,
    /// the parent of a store read and a re-validation.
    func lookup(_ headers: some HeaderValues, trace: TraceContext? = nil, on loop: any EventLoop) -> Lookup {
        let handle: SessionHandle
        switch presented(headers) {
        case .none: return .now(.anonymous)
        case .invalid: return .now(.invalid(nil))
        case .session(let h): handle = h
        }
        // A logout the store has not taken yet: refused whether or not the store answers.
        if core.revocations.held.denies(key: handle.key) { return .now(.invalid(.signedOut)) }
        let t = core.now()
        if let cached = core.cache.get(handle) {
            core.metrics.cacheHits.increment()
            return admit(handle, cached, now: t, trace: trace, on: loop)
        }
        core.metrics.cacheMisses.increment()
        let loaded = core.store.load(handle, on: loop)
        OpenSpan.store(.load, tracer: core.tracer, parent: trace)?.end(with: loaded)
        return .later(loaded.flatMap { stored -> EventLoopFuture<Resolution> in
            // Gone: why, when the store remembers (a logout, a revocation); else it expired.
            guard let stored else { return self.core.store.end(of: handle, on: loop).map { .invalid($0 ?? .expired) }.recover { _ in .invalid(.expired) } }
            let cached = CachedSession(stored: stored)
            if self.isLive(stored, now: t) {
                var kept = cached
                kept.stored.session = stored.session.withoutToken  // read again when a re-validation is due
                self.core.cache.put(handle, sub: stored.session.sub, kept)
            }
            switch self.admit(handle, cached, now: t, trace: trace, on: loop) {
            case .now(let resolution): return loop.makeSucceededFuture(resolution)
            case .later(let future): return future
            }
        }.recover { error in
            self.core.logger.warning("session store unavailable: admission answers 503", metadata: ["error": "\(error)"])
            return .unavailable
        })
    }

    /// `lookup` from anywhere (async code): runs on `loop`, answers a future.
    /// In a trace (`TraceScope`), the store read is its child.
    func resolve(_ headers: HTTPHeaders, on loop: any EventLoop) -> EventLoopFuture<Resolution> {
        let trace = TraceScope.current?.context  // a task-local: read here, not on the loop
        return loop.flatSubmit {
            switch self.lookup(headers, trace: trace, on: loop) {
            case .now(let resolution): return loop.makeSucceededFuture(resolution)
            case .later(let future): return future
            }
        }
    }

    /// Acts on `SessionPolicy`'s decision: drops a dead session from the cache, records activity,
    /// and asks Apple when a re-validation is due (in the background, or before answering).
    private func admit(_ handle: SessionHandle, _ cached: CachedSession, now t: Int64, trace: TraceContext?, on loop: any EventLoop) -> Lookup {
        let session = cached.stored.session
        // A revocation the store has not taken yet (`HeldRevocations`): refused here. The cache
        // keeps the session meanwhile, so that it is refused without asking the store.
        if core.revocations.held.denies(key: handle.key, sub: session.sub, created: session.created) { return .now(.invalid(.revoked)) }
        let revalidation: SessionPolicy.Revalidation
        switch policy.decide(cached.stored, now: t) {
        case .dead(let end):
            core.cache.invalidate(handle)
            return .now(.invalid(end == .revoked ? .revoked : .expired))
        case .live(let touch, let r):
            revalidation = r
            if touch {
                core.cache.update(handle) { $0.stored.session.lastSeen = t }
                core.store.touch(handle, lastSeen: t, expiresAt: policy.expiry(afterTouching: session, at: t), on: loop).whenFailure { error in
                    self.core.logger.debug("could not record session activity", metadata: ["error": "\(error)"])
                }
            }
        }
        guard let revalidator = core.revalidator else { return .now(.session(handle, cached)) }
        switch revalidation {
        case .none:
            return .now(.session(handle, cached))
        case .background:
            core.metrics.recordRevalidation(kind: .background)
            revalidator.validate(session, keep: absoluteTimeout, scope: TraceScope(core.tracer, trace), on: loop).whenSuccess { outcome in
                if case .valid(let at) = outcome { self.core.cache.update(handle) { $0.stored.session.validatedAt = at } }
            }
            return .now(.session(handle, cached))
        case .beforeAnswering:
            core.metrics.recordRevalidation(kind: .blocking)
            return .later(revalidator.validate(session, keep: absoluteTimeout, scope: TraceScope(core.tracer, trace), on: loop).hop(to: loop).map { outcome in
                switch outcome {
                case .valid(let at):
                    self.core.cache.update(handle) { $0.stored.session.validatedAt = at }
                    var fresh = cached
                    fresh.stored.session.validatedAt = at
                    return .session(handle, fresh)
                case .revoked:
                    self.core.cache.invalidate(handle)
                    return .invalid(.revoked)
                case .unknown:
                    return self.policy.keepsWithoutApple(session, now: t) ? .session(handle, cached) : .appleUnavailable
                }
            })
        }
    }

    func isLive(_ s: StoredSession, now t: Int64) -> Bool { times.isLive(s, now: t) }

    // MARK: sessions

    /// A new session for a verified Apple identity: a fresh id (never one the client sent), the
    /// refresh token sealed, the profile merged. Answers the cookie value and the expiry (ms).
    func createSession(identity: AppleIdentity, refreshToken: String?, name: String?, on loop: any EventLoop) -> EventLoopFuture<(cookie: String, expiresAt: Int64, user: UserProfile)> {
        core.metrics.recordRevalidation(kind: .fresh)
        let (cookie, handle) = core.keys.newSession(for: identity.subject)
        let t = core.now()
        let record = SessionRecord(handle: handle, sub: identity.subject, clientID: identity.audience, created: t, lastSeen: t, validatedAt: t,
                                   sealedRefreshToken: refreshToken.map { core.keys.seal($0, for: handle) })
        let profile = UserProfile(sub: identity.subject, name: name, email: identity.email, emailVerified: identity.emailVerified,
                                  privateEmail: identity.isPrivateEmail, realUserStatus: identity.realUserStatus)
        // The session ends after idle_timeout without activity, and at expires_at at the latest.
        let expiresAt = t + absoluteTimeout
        return core.store.create(record, profile: profile, expiresAt: t + idleTimeout, on: loop).flatMap { () -> EventLoopFuture<Void> in
            // Kept beyond the session, so that a deletion can revoke it at Apple.
            guard let refreshToken else { return loop.makeSucceededVoidFuture() }
            let sealed = self.core.keys.seal(refreshToken, context: SessionKeys.userContext(identity.subject))
            return self.core.store.saveRefreshToken(sealed, clientID: identity.audience, grantedAt: t, of: identity.subject, on: loop)
        }.flatMap {
            self.core.store.profile(of: identity.subject, on: loop)
        }.map { stored in
            (cookie, expiresAt, stored ?? profile)
        }
    }

    /// `Set-Cookie` for a session: Secure, Path=/, HttpOnly, Lax; no `Domain` (the `__Host-`
    /// rules) unless `session.cookie_domain` shares it with that domain's hosts. `hostOnly`: the
    /// copy a sign-in ticket sets on a host outside that domain.
    func sessionCookie(_ value: String, hostOnly: Bool = false) -> (String, String) {
        ("set-cookie", "\(cookieName)=\(value); Path=/\(domainAttribute(hostOnly)); Secure; HttpOnly; SameSite=Lax; Max-Age=\(absoluteTimeout / 1000)")
    }

    /// Clears the session cookie where `sessionCookie` set it (with its `Domain`, if any) and
    /// the host-only copy of the host answering.
    func clearSessionCookie() -> [(String, String)] {
        [clearCookie(cookieName)] + (cookieDomain == nil ? [] : [clearCookie(cookieName, domain: true)])
    }

    private func domainAttribute(_ hostOnly: Bool) -> String {
        guard let cookieDomain, !hostOnly else { return "" }
        return "; Domain=" + cookieDomain
    }

    /// - Parameter domain: the copy set with `session.cookie_domain`'s `Domain`.
    func clearCookie(_ name: String, sameSiteNone: Bool = false, domain: Bool = false) -> (String, String) {
        ("set-cookie", "\(name)=; Path=/\(domainAttribute(!domain)); Secure; HttpOnly; SameSite=\(sameSiteNone ? "None" : "Lax"); Max-Age=0")
    }
}
