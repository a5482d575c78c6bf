import GatewayConfig
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// Which session a request presents: the cookie or the bearer token, read from the header
/// bytes without copies, ambiguity refused (security.md).
extension Authenticator {
    enum Credential {
        case none
        /// The cookie or the bearer token sent twice, a cookie and a bearer token naming
        /// different sessions: treated as unauthenticated (security.md), whichever is valid.
        case ambiguous
        case value(Substring)
    }

    /// `Authorization: Bearer` or the session cookie; both only if they carry the same token (a
    /// native app may send its cookie jar too). The token is a slice of its field's value; the
    /// `Authorization` fields are not even looked at when the proxy saw no bearer.
    func credential(_ headers: some HeaderValues) -> Credential {
        var bearer: Substring? = nil
        var cookie: Substring? = nil
        var doubled = false
        if headers.mayCarryBearer {
            headers.forEachValue(named: "authorization") { value in
                if let token = Self.bearerToken(value) {
                    if bearer != nil { doubled = true }
                    bearer = token
                }
            }
        }
        headers.forEachValue(named: "cookie") { value in
            Self.forEachCookie(named: cookieMarker, in: value) { v in
                if cookie != nil { doubled = true }
                cookie = v
            }
        }
        if doubled { return .ambiguous }
        switch (bearer, cookie) {
        case (nil, nil): return .none
        case (let b?, nil): return .value(b)
        case (nil, let c?): return .value(c)
        case (let b?, let c?): return b == c ? .value(b) : .ambiguous
        }
    }

    /// Whether `Authorization: Bearer` carries one of our session tokens (signature valid): then it
    /// is the gateway's credential and never reaches the app.
    /// Every `Authorization` header is looked at: a junk bearer first must not hide ours.
    func carriesSessionBearer(_ headers: some HeaderValues) -> Bool {
        var carries = false
        headers.forEachValue(named: "authorization") { value in
            if !carries, let token = Self.bearerToken(value), core.keys.handle(forCookie: token) != nil { carries = true }
        }
        return carries
    }

    /// The token of an `Authorization: Bearer <token>` value (scheme without case).
    static func bearerToken(_ value: String) -> Substring? {
        let v = value.drop { $0 == " " }
        guard v.utf8.count > 7, HeaderName.equals(v.prefix(7), "bearer ") else { return nil }
        return v.dropFirst(7).drop { $0 == " " }
    }

    /// Calls `body` with the value of every `name=value` pair in a `Cookie` header whose name
    /// is `marker` minus its `=`. Scans bytes; the values are slices of `header`.
    static func forEachCookie(named marker: String, in header: String, _ body: (Substring) -> Void) {
        let bytes = header.utf8
        let markerBytes = marker.utf8
        var i = bytes.startIndex
        while i < bytes.endIndex {
            // Skip the separator's spaces, then compare the name.
            while i < bytes.endIndex, bytes[i] == UInt8(ascii: " ") || bytes[i] == UInt8(ascii: "\t") { i = bytes.index(after: i) }
            let pairStart = i
            var end = i
            while end < bytes.endIndex, bytes[end] != UInt8(ascii: ";") { end = bytes.index(after: end) }
            if bytes[pairStart..<end].starts(with: markerBytes) {
                let valueStart = bytes.index(pairStart, offsetBy: markerBytes.count)
                body(Substring(bytes[valueStart..<end]))
            }
            i = end < bytes.endIndex ? bytes.index(after: end) : end
        }
    }

    /// The value of the named cookie, if sent exactly once.
    static func cookie(_ name: String, in headers: HTTPHeaders) -> String? {
        var found: String? = nil
        var count = 0
        for value in headers["cookie"] {
            forEachCookie(named: name + "=", in: value) { v in
                count += 1
                found = String(v)
            }
        }
        return count == 1 ? found : nil
    }
}
