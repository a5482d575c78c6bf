import GatewayConfig
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// What the app is told about the user on each forwarded request: the identity headers of
/// DESIGN §1 and, when enabled, the signed assertion.
extension Authenticator {
    /// The identity headers of DESIGN §1 for a stored session's user (and linked account);
    /// values never carry CR, LF or NUL.
    func identityHeaders(_ stored: StoredSession) -> [(String, String)] {
        Self.identityHeaders(stored.user, account: stored.account, names: names, now: core.now())
    }

    /// - Parameter now: Unix ms; the former `sub` of a transferred user is sent during the
    ///   transfer period after their mapping only (`UserProfile.formerSub(at:)`).
    static func identityHeaders(_ user: UserProfile, account: String? = nil, names: IdentityHeaderNames, now: Int64) -> [(String, String)] {
        var h: [(String, String)] = [(names.user, user.sub)]
        if let v = user.email { h.append((names.email, v)) }
        if let v = user.emailVerified { h.append((names.emailVerified, v ? "true" : "false")) }
        if let v = user.privateEmail { h.append((names.privateEmail, v ? "true" : "false")) }
        if let v = user.emailForwarding { h.append((names.emailForwarding, v)) }
        if let v = user.name { h.append((names.name, FormBody.escape(v))) }  // UTF-8, percent-encoded
        if let v = user.realUserStatus { h.append((names.realUserStatus, String(v))) }
        if let account { h.append((names.account, account)) }
        if let v = user.formerSub(at: now) { h.append((names.formerUser, v)) }
        return h.filter { HTTPWire.isSafeValue($0.1) }
    }

    /// The headers to forward for a session on a route (identity, plus an assertion when enabled;
    /// a fresh one is cached until half its lifetime is left).
    func forwardHeaders(_ handle: SessionHandle, _ cached: CachedSession, route: String, on loop: any EventLoop) -> [(String, String)] {
        var cached = cached
        if cached.generation != generation {
            // Cached under another configuration: its header names (and assertion issuer) may
            // have changed. Rebuilt once, then cached for this generation.
            cached.headers = identityHeaders(cached.stored)
            cached.generation = generation
            cached.assertion = nil
            let (headers, generation) = (cached.headers, generation)
            core.cache.update(handle) {
                // A request of an older generation finishing late must not undo a newer rebuild.
                guard $0.generation < generation else { return }
                $0.headers = headers
                $0.generation = generation
                $0.assertion = nil
            }
        }
        guard let assertion else { return cached.headers }
        let t = core.now() / 1000
        if let a = cached.assertion, a.route == route, a.expires - t > assertion.ttl / 2 {
            return cached.headers + [(names.assertion, a.token)]
        }
        let user = cached.stored.user
        let token = assertion.sign(UserProfileClaims(sub: user.sub, email: user.email, emailVerified: user.emailVerified, name: user.name,
                                                     account: cached.stored.account, formerSub: user.formerSub(at: t * 1000)), audience: route, now: t)
        let generation = self.generation
        core.cache.update(handle) {
            guard $0.generation == generation else { return }
            $0.assertion = (route, token, t + assertion.ttl)
        }
        return cached.headers + [(names.assertion, token)]
    }
}
