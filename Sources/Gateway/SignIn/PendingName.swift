import AppleID
import Foundation
import Sessions

/// The name of a first authorization that its callback could not store (issue 25 §4).
///
/// Apple sends the name once, in the `user` field of the first authorization's callback, and
/// never again (apple-sign-in.md §1.3, §11.8). When that callback fails before the profile holds
/// the name (Apple's keys unreachable, the store down), the browser keeps it in a cookie
/// (`<session.cookie_name>-name`) until a retry's sign-in completes, for at most `lifetime`:
///
/// - sealed (AES-GCM under the session secret) for the Apple user it belongs to: it opens only
///   for that `sub`, only with this gateway's secret, only before its expiry (inside the seal);
///   the name is never in a URL, a log line or a cookie in the clear;
/// - `HttpOnly; Secure; SameSite=None` (Apple's callback is a cross-site POST) and hidden from
///   the app like the gateway's other cookies;
/// - used by a later callback only when Apple sent no name of its own, and cleared once the
///   sign-in completes.
enum PendingName {
    /// How long the browser keeps it (seconds): an hour, for an outage of Apple or the store to
    /// pass; after that only revoking the app at Apple brings the name back (TN3194).
    static let lifetime: Int64 = 3600
    /// Longer sealed values are not kept: a browser drops a cookie over 4 KiB.
    static let maximumSealedLength = 3072

    /// The sealed cookie value, or nil if it would be too long for a cookie.
    static func seal(_ name: String, sub: String, nowMilliseconds: Int64, keys: SessionKeys) -> String? {
        let sealed = keys.seal("\(nowMilliseconds / 1000 + lifetime) \(name)", context: context(sub))
        return sealed.utf8.count <= maximumSealedLength ? sealed : nil
    }

    /// The name sealed for `sub`, if `sealed` is one this gateway made for them and it has not expired.
    static func open(_ sealed: String, sub: String, nowMilliseconds: Int64, keys: SessionKeys) -> String? {
        guard sealed.utf8.count <= maximumSealedLength, let plain = keys.open(sealed, context: context(sub)),
              let space = plain.firstIndex(of: " "), let expires = Int64(plain[..<space]), nowMilliseconds / 1000 < expires else { return nil }
        let name = String(plain[plain.index(after: space)...])
        return name.isEmpty ? nil : name
    }

    /// The sealing context: a value sealed for one user never opens for another, nor as a
    /// session's or a user's refresh token.
    static func context(_ sub: String) -> String { "pending-name " + sub }

    /// The `sub` claim of an identity token, read **without** verifying it: only to bind a name
    /// that this browser's verified login state vouches for to the user the token names (the
    /// seal opens only when a later, verified sign-in is that user). Never an identity.
    static func unverifiedSubject(of token: String) -> String? {
        guard token.utf8.count <= 16 * 1024, let sub = Base64URL.unverifiedClaims(ofJWS: token)?["sub"] as? String,
              AuthEndpointGuard.isSubject(sub) else { return nil }
        return sub
    }
}

extension Authenticator {
    /// The cookie that keeps a first authorization's name across a failed callback (`PendingName`).
    var nameCookieName: String { cookieName + "-name" }
}
