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

    /// The session a request's credential names (signature valid), live or not.
    enum Presented {
        case none
        /// Forged, malformed, or ambiguous (`Credential.ambiguous`).
        case invalid
        case session(SessionHandle)
    }

    /// `credential`, then the handle it names. Without a bearer (the proxy's pass saw none: a
    /// browser), the cookie is read from the header's bytes, and only a cookie not seen lately
    /// becomes a `String` (`SessionKeys.handle(forCookie:)`).
    func presented(_ headers: some HeaderValues) -> Presented {
        guard !headers.mayCarryBearer else {
            switch credential(headers) {
            case .none: return .none
            case .ambiguous: return .invalid
            case .value(let value): return core.keys.handle(forCookie: value).map(Presented.session) ?? .invalid
            }
        }
        var count = 0
        var handle: SessionHandle? = nil
        headers.forEachValueBytes(named: "cookie") { value in
            Self.forEachCookie(named: cookieMarker, in: value) { cookie in
                count += 1
                if count == 1 { handle = core.keys.handle(forCookie: cookie) }
            }
        }
        switch count {
        case 0: return .none
        case 1: return handle.map(Presented.session) ?? .invalid
        default: return .invalid  // sent twice (`Credential.ambiguous`)
        }
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
    static func forEachCookie(named marker: [UInt8], in header: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer) -> Void) {
        var i = 0
        let end = header.count
        while i < end {
            // Skip the separator's spaces, then compare the name.
            while i < end, header[i] == UInt8(ascii: " ") || header[i] == UInt8(ascii: "\t") { i += 1 }
            let pairStart = i
            while i < end, header[i] != UInt8(ascii: ";") { i += 1 }
            var named = i - pairStart >= marker.count
            var k = 0
            while named, k < marker.count {
                named = header[pairStart + k] == marker[k]
                k += 1
            }
            if named { body(UnsafeRawBufferPointer(rebasing: header[(pairStart + marker.count)..<i])) }
            i += 1
        }
    }

    /// `forEachCookie` over a `String`: the values are slices of `header`.
    static func forEachCookie(named marker: [UInt8], in header: String, _ body: (Substring) -> Void) {
        var contiguous = header
        let utf8 = header.utf8
        contiguous.withUTF8 { all in
            let base = UnsafeRawBufferPointer(all)
            forEachCookie(named: marker, in: base) { value in
                let start = utf8.index(utf8.startIndex, offsetBy: value.baseAddress.map { $0 - base.baseAddress! } ?? 0)
                body(Substring(utf8[start..<utf8.index(start, offsetBy: value.count)]))
            }
        }
    }

    /// The value of the named cookie, if sent exactly once.
    static func cookie(_ name: String, in headers: HTTPHeaders) -> String? {
        var found: String? = nil
        var count = 0
        let marker = Array((name + "=").utf8)
        for value in headers["cookie"] {
            forEachCookie(named: marker, in: value) { v in
                count += 1
                found = String(v)
            }
        }
        return count == 1 ? found : nil
    }
}
