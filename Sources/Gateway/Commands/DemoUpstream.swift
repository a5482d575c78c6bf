import HTTPProxy
import NIOCore
import NIOHTTP1

/// The demo's upstream application: it shows the request exactly as it arrived behind the
/// gateway — method, target, and every header (identity headers included) — as HTML for
/// browsers and plain text for everything else.
public enum DemoUpstream {
    /// - Parameter linking: the gateway's links API and its secret: an unlinked user's page shows
    ///   the call the app would make to link them to one of its accounts.
    public static func start(host: String, port: Int, group: any EventLoopGroup, linking: (links: String, secret: String)? = nil) async throws -> SimpleHTTPServer {
        try await SimpleHTTPServer.start(host: host, port: port, group: group) { respond($0, linking: linking) }
    }

    static func respond(_ request: SimpleRequest, linking: (links: String, secret: String)? = nil) -> SimpleResponse {
        let head = request.head
        let wantsHTML = head.headers["accept"].contains { $0.contains("text/html") }
        if !wantsHTML {
            var text = "demo upstream received:\n\(head.method.rawValue) \(head.uri) HTTP/\(head.version.major).\(head.version.minor)\n"
            for (name, value) in head.headers { text += "\(name): \(value)\n" }
            if request.body.readableBytes > 0 { text += "\n(\(request.body.readableBytes) body bytes)\n" }
            return SimpleResponse(text)
        }
        let identity = head.headers.filter { $0.name.lowercased().hasPrefix("x-auth-") }
        var rows = ""
        for (name, value) in head.headers {
            let highlight = name.lowercased().hasPrefix("x-auth-") || name.lowercased().hasPrefix("x-forwarded-") || name.lowercased() == "x-request-id"
            rows += "<tr\(highlight ? " class=\"hl\"" : "")><th>\(escape(name))</th><td>\(escape(value))</td></tr>\n"
        }
        let user = identity.first { $0.name.lowercased() == "x-auth-user" }?.value
        let account = identity.first { $0.name.lowercased() == "x-auth-account" }?.value
        var who = user.map { "Signed in as <b>\(escape($0))</b>" }
            ?? "No identity headers: this request reached the upstream without a session (a public or optional route)."
        if let user, let linking {
            if let account {
                who += "<br>Linked to the app's account <b>\(escape(account))</b> (<code>X-Auth-Account</code>)."
            } else {
                // What a real app does after checking the person's legacy password, server to server.
                let command = "curl -X POST \(linking.links) -H 'Authorization: Bearer \(linking.secret)' -H 'Content-Type: application/json' -d '{\"sub\":\"\(user)\",\"account\":\"demo-42\"}'"
                who += "<br>Not linked to an account of the app: no <code>X-Auth-Account</code>. An app links one after checking the person's own password; here, run this and reload:<br><code>\(escape(command))</code>"
            }
        }
        let html = """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <title>SessionGate demo upstream</title>
        <style>
        body{font:16px/1.5 -apple-system,BlinkMacSystemFont,"Helvetica Neue",Arial,sans-serif;margin:2rem auto;max-width:54rem;padding:0 1rem;color:#1d1d1f}
        h1{font-size:1.6rem;margin-bottom:.2rem} .sub{color:#6e6e73;margin-top:0}
        code{background:#f5f5f7;padding:.1rem .35rem;border-radius:4px}
        table{border-collapse:collapse;width:100%;margin-top:1rem;font-size:.92rem}
        th,td{text-align:left;padding:.35rem .6rem;border-bottom:1px solid #e5e5ea;vertical-align:top;word-break:break-all}
        th{width:14rem;font-weight:600} tr.hl{background:#eef6ff}
        .who{padding:.7rem 1rem;background:#f5f5f7;border-radius:8px}
        </style></head><body>
        <h1>Demo upstream</h1>
        <p class="sub">This page is served by the application <em>behind</em> SessionGate. It shows the request as the gateway forwarded it.</p>
        <p class="who">\(who)</p>
        <p><code>\(escape(head.method.rawValue)) \(escape(head.uri))</code></p>
        <table>\(rows)</table>
        <p class="sub">Highlighted: headers the gateway set (forwarding, request id, identity). Anything a client sends under those names is removed first.</p>
        </body></html>
        """
        return SimpleResponse(contentType: "text/html; charset=utf-8", html)
    }

    static func escape(_ text: String) -> String { AuthPages.escape(text) }
}
