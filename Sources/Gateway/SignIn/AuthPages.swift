import Foundation

/// The HTML the gateway serves: the sign-in page (Apple's Human Interface Guidelines for the
/// button), failure pages, and the sign-out confirmation. Self-contained: no script, no
/// external resource (the CSP forbids both).
enum AuthPages {
    /// Apple's logo as a single path (drawn for this project), in a 20×24 box.
    static let appleLogo = #"<svg class="logo" viewBox="0 0 20 24" aria-hidden="true" focusable="false"><path fill="currentColor" d="M13.6 .5c.1 1.3-.4 2.6-1.2 3.5-.8.9-2 1.6-3.2 1.5-.1-1.2.5-2.5 1.2-3.3.8-.9 2.1-1.6 3.2-1.7zM19.3 17.6c-.5 1.2-.8 1.7-1.4 2.8-.9 1.5-2.2 3.3-3.8 3.3-1.4 0-1.8-.9-3.7-.9-1.9 0-2.4.9-3.8.9-1.6 0-2.8-1.6-3.7-3.1C.3 16.4 0 11.6 1.6 9c1.1-1.8 2.9-2.9 4.6-2.9 1.7 0 2.8.9 4.2.9 1.4 0 2.2-.9 4.2-.9 1.5 0 3.1.8 4.2 2.2-3.7 2-3.1 7.3.5 8.3z"/></svg>"#

    static let style = """
        :root{color-scheme:light dark;--bg:#f5f5f7;--card:#fff;--text:#1d1d1f;--muted:#6e6e73;--btn-bg:#000;--btn-fg:#fff;--btn-border:#000}
        @media (prefers-color-scheme:dark){:root{--bg:#000;--card:#1c1c1e;--text:#f5f5f7;--muted:#a1a1a6;--btn-bg:#fff;--btn-fg:#000;--btn-border:#fff}}
        *{box-sizing:border-box}
        body{margin:0;min-height:100vh;display:flex;align-items:center;justify-content:center;background:var(--bg);color:var(--text);
          font:17px/1.47 -apple-system,BlinkMacSystemFont,"SF Pro Text","Helvetica Neue",Helvetica,Arial,sans-serif}
        main{background:var(--card);width:100%;max-width:380px;margin:24px;padding:40px 32px 32px;border-radius:18px;box-shadow:0 4px 24px rgba(0,0,0,.08);text-align:center}
        h1{font-size:28px;line-height:1.14;font-weight:600;margin:0 0 8px;letter-spacing:.007em}
        p{margin:0 0 24px;color:var(--muted)}
        .notice{margin:0 0 20px;padding:10px 14px;border-radius:10px;background:rgba(255,149,0,.14);color:var(--text);font-size:15px;text-align:left}
        .siwa{display:flex;align-items:center;justify-content:center;gap:6px;width:100%;min-width:140px;height:44px;padding:0 16px;border-radius:8px;
          background:var(--btn-bg);color:var(--btn-fg);border:1px solid var(--btn-border);text-decoration:none;
          font:500 19px/1 -apple-system,BlinkMacSystemFont,"SF Pro Text","Helvetica Neue",Helvetica,Arial,sans-serif;letter-spacing:-.01em;cursor:pointer}
        .siwa .logo{width:15px;height:18px;margin-top:-3px;flex:none}
        .siwa:focus-visible{outline:3px solid #0071e3;outline-offset:3px}
        .siwa.white{--btn-bg:#fff;--btn-fg:#000;--btn-border:#fff}
        .siwa.outline{--btn-bg:#fff;--btn-fg:#000;--btn-border:#000}
        .secondary{display:inline-block;margin-top:16px;color:#0071e3;background:none;border:0;font:inherit;cursor:pointer;text-decoration:none}
        .fine{margin:24px 0 0;font-size:12px;color:var(--muted)}
        """

    static func document(title: String, _ body: String) -> String {
        """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
        <meta name="robots" content="noindex"><title>\(escape(title))</title><style>\(style)</style></head>
        <body><main>
        \(body)
        </main></body></html>
        """
    }

    /// Messages the sign-in page can show (`?message=`): fixed texts, never echoed input.
    static let messages: [String: String] = [
        "cancelled": "Sign in was cancelled. You can try again whenever you are ready.",
        "signed_out": "You have been signed out.",
        "disconnected": "This site no longer uses your Apple Account, and every session has ended.",
        "disconnected_here": "You are signed out everywhere here, but Apple has not confirmed that this site no longer uses your Apple Account. To stop it, open Settings on your iPhone, tap your name, then Sign-In & Security, then Sign in with Apple (or go to account.apple.com).",
        "deleted": "Your account has been deleted: every session has ended, this site no longer holds your name or email, and it no longer uses your Apple Account.",
        "deleted_here": "Your account has been deleted and every session has ended, but Apple has not confirmed that this site no longer uses your Apple Account. To stop it, open Settings on your iPhone, tap your name, then Sign-In & Security, then Sign in with Apple (or go to account.apple.com).",
        "expired": "Your sign-in took too long or was already used. Please start again.",
    ]

    static func signIn(loginURL: String, message: String?) -> String {
        let notice = message.flatMap { messages[$0] }.map { #"<p class="notice" role="status">\#(escape($0))</p>"# } ?? ""
        return document(title: "Sign in", """
            <h1>Sign in</h1>
            <p>Continue with your Apple Account to reach this site.</p>
            \(notice)
            <a class="siwa" href="\(escape(loginURL))" role="button" aria-label="Sign in with Apple">\(appleLogo)<span>Sign in with Apple</span></a>
            <p class="fine">Apple shares only your name and an email address — which can be a private relay address — with this site.</p>
            """)
    }

    static func message(title: String, detail: String, action: (label: String, url: String)?) -> String {
        let link = action.map { #"<a class="siwa outline" href="\#(escape($0.url))">\#(escape($0.label))</a>"# } ?? ""
        return document(title: title, """
            <h1>\(escape(title))</h1>
            <p>\(escape(detail))</p>
            \(link)
            """)
    }

    static func confirmSignOut(action: String, stay: String = "/") -> String {
        document(title: "Sign out", """
            <h1>Sign out?</h1>
            <p>You will need to sign in with Apple again to come back.</p>
            <form method="post" action="\(escape(action))"><button class="siwa" type="submit">Sign out</button></form>
            <a class="secondary" href="\(escape(stay))">Stay signed in</a>
            """)
    }

    static func confirmDeletion(action: String) -> String {
        document(title: "Delete account", """
            <h1>Delete your account?</h1>
            <p>Every session ends, this site forgets your name, email and linked account, and stops using your Apple Account. This cannot be undone.</p>
            <form method="post" action="\(escape(action))"><button class="siwa" type="submit">Delete my account</button></form>
            <a class="secondary" href="/">Keep my account</a>
            """)
    }

    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for c in text.unicodeScalars {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }
}
