import GatewayConfig
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// Admission for one route (DESIGN §2 step 3): `auth: required | optional | public`, the
/// allow lists, and what an unauthenticated request gets (`redirect` for browsers, `deny`).
struct SessionGuard: RequestGuard {
    let auth: Authenticator
    /// The process's parts (`auth.core`).
    var core: AuthCore { auth.core }
    let route: GatewayConfiguration.Route
    let allow: AllowList

    init(auth: Authenticator, route: GatewayConfiguration.Route) {
        self.auth = auth
        self.route = route
        self.allow = AllowList(route.allow)
    }

    /// `Authorization` when it carried our session token: a live credential in every app log.
    private static let bearer = ["authorization"]

    func admit(_ request: GuardRequest, on loop: any EventLoop) -> GuardDecision {
        if route.auth == .public {
            return .verdict(withoutSession(request))
        }
        if route.preflight == .pass, request.isPreflight {
            // Unauthenticated to the app, as on a public route.
            core.metrics.recordAdmission(.preflight)
            return .verdict(withoutSession(request))
        }
        switch auth.lookup(request, trace: request.trace, on: loop) {
        case .now(let resolution): return .verdict(verdict(resolution, request, on: loop))
        case .later(let future): return .pending(future.map { verdict($0, request, on: loop) })
        }
    }

    /// Forwarded without a session (a public route, a passed preflight, an optional route's
    /// anonymous request): a credential it carries is not looked at, and our session's bearer
    /// token is not passed on.
    private func withoutSession(_ request: GuardRequest) -> Verdict {
        request.hasBearer && auth.carriesSessionBearer(request) ? .forward(addHeaders: [], removeHeaders: Self.bearer) : .forward
    }

    /// A lease for a WebSocket this session opens: ended with the session, or at its absolute expiry.
    private func openTunnel(_ handle: SessionHandle, _ cached: CachedSession, on loop: any EventLoop) -> TunnelLease {
        let remaining = cached.stored.session.created + auth.absoluteTimeout - core.now()
        return core.tunnels.open(handle: handle, sub: cached.stored.session.sub, times: auth.times, endsIn: .milliseconds(max(0, remaining)), on: loop)
    }

    private func verdict(_ resolution: Resolution, _ request: GuardRequest, on loop: any EventLoop) -> Verdict {
        switch resolution {
        case .session(let handle, let cached):
            guard allow.admits(cached.stored.user) else {
                core.metrics.recordAdmission(.forbidden)
                return .respond(AuthResponses.forbidden(request.head, signOutURL: auth.prefix + "/logout"))
            }
            if route.requireLink, cached.stored.account == nil, let linkURL = auth.linkURL {
                core.metrics.recordAdmission(.linkRequired)
                return .respond(AuthResponses.linkRequired(request, linkURL: linkURL))
            }
            core.metrics.recordAdmission(.session)
            return .forward(addHeaders: auth.forwardHeaders(handle, cached, route: route.name, on: loop),
                            // A bearer beside a live session is that session's token (a cookie
                            // naming another session would have made the credential ambiguous).
                            removeHeaders: request.hasBearer ? Self.bearer : [],
                            tunnel: request.isWebSocketUpgrade ? openTunnel(handle, cached, on: loop) : nil,
                            user: cached.stored.session.sub)
        case .anonymous, .invalid:
            if route.auth == .optional {
                core.metrics.recordAdmission(.anonymous)
                return withoutSession(request)
            }
            core.metrics.recordAdmission(.unauthenticated)
            return .respond(AuthResponses.unauthenticated(request, action: route.unauthenticated, prefix: auth.prefix, ended: resolution.ended))
        case .unavailable:
            core.metrics.recordAdmission(.storeUnavailable)
            return .respond(AuthResponses.storeUnavailable(request.head))
        case .appleUnavailable:
            core.metrics.recordAdmission(.appleUnavailable)
            return .respond(AuthResponses.appleUnavailable(request.head, prefix: auth.prefix))
        }
    }
}

/// A route's `allow` lists. Empty lists admit every signed-in user; otherwise the user must
/// match one entry. `email_domains` only counts a verified email with exactly one `@`.
struct AllowList: Sendable {
    let users: Set<String>
    let emails: Set<String>
    let domains: Set<String>
    var isOpen: Bool { users.isEmpty && emails.isEmpty && domains.isEmpty }

    init(_ allow: GatewayConfiguration.Allow) {
        users = Set(allow.users)
        emails = Set(allow.emails.map { $0.lowercased() })
        domains = Set(allow.emailDomains.map { $0.lowercased().hasPrefix("@") ? String($0.lowercased().dropFirst()) : $0.lowercased() })
    }

    /// `allow.users` names the user by their `sub`, or by their `sub` at the team the app was
    /// transferred from (an entry written before the transfer keeps matching once the user is
    /// mapped: `migrate import` or their first sign-in at the new team).
    func admits(_ user: UserProfile) -> Bool {
        if isOpen || users.contains(user.sub) || user.formerSub.map(users.contains) == true { return true }
        guard let email = user.email?.lowercased(), user.emailVerified == true else { return false }
        if emails.contains(email) { return true }
        let parts = email.split(separator: "@", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty else { return false }
        return domains.contains(String(parts[1]))
    }
}
