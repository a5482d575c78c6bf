import GatewayConfig
import HTTPProxy

/// Where `/_auth/logout` sends a browser: the `post_logout_redirect` of the route that covers the
/// page it signed out from (`rd`, matched as `RouteTable` routes a request: the routes naming
/// the host if any, else the host-less ones; the longest prefix on a segment boundary), else the
/// sign-in page.
struct PostLogoutPolicy: Sendable {
    struct Entry: Sendable {
        var host: String?
        var prefix: String
        var target: String?
    }

    let entries: [Entry]
    let signIn: String

    init(_ routes: [GatewayConfiguration.Route], signIn: String) {
        entries = routes.map { Entry(host: $0.host, prefix: $0.pathPrefix, target: $0.postLogoutRedirect) }
            .sorted { $0.prefix.utf8.count > $1.prefix.utf8.count }
        self.signIn = signIn
    }

    /// `rd` is a validated return URL (a path, or an absolute URL on an allowed host).
    func target(from rd: String?, host: String?) -> String {
        guard let rd, rd.hasPrefix("/") else { return signIn }
        let path = String(rd.prefix { $0 != "?" && $0 != "#" })
        // As `RouteTable.match`: when some route names the host, only those routes count (a
        // path none of them covers is served by no route: the sign-in page).
        let named = entries.filter { $0.host != nil && $0.host == host }
        let candidates = named.isEmpty ? entries.filter { $0.host == nil } : named
        return candidates.first { ProxyRoute.covers(prefix: $0.prefix, path: path) }?.target ?? signIn
    }
}
