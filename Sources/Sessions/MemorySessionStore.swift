import NIOConcurrencyHelpers
import NIOCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The embedded store: everything in one process, behind one lock. One gateway instance only;
/// sessions end when it restarts. Expired entries are skipped on read and swept as they pile up.
public final class MemorySessionStore: SessionStore {
    private struct State {
        var sessions: [SessionHandle: (record: SessionRecord, expiresAt: Int64)] = [:]
        var users: [String: UserProfile] = [:]
        var userSessions: [String: Set<SessionHandle>] = [:]
        var revoked: [String: (at: Int64, expiresAt: Int64)] = [:]
        var userTokens: [String: [String: (sealed: String, grantedAt: Int64)]] = [:]
        /// When a revoked user's profile and tokens expire (`revoke` without a survivor).
        var userExpiry: [String: Int64] = [:]
        var jobs: [String: OutboxJob] = [:]
        var nonces: [String: (clientID: String, expiresAt: Int64)] = [:]
        var links: [String: String] = [:]  // sub → account
        var accounts: [String: String] = [:]  // account → sub
        var transfers: [String: (record: TransferRecord, expiresAt: Int64)] = [:]
        var logins: [String: (login: LoginState, expiresAt: Int64)] = [:]
        var claims: [String: Int64] = [:]
        var validations: [String: (record: ValidationRecord, expiresAt: Int64)] = [:]
        var writesSinceSweep = 0
        var returnURL: String? = nil
        var ended: [SessionHandle: (end: SessionEnd, expiresAt: Int64)] = [:]

        mutating func sweep(now: Int64) {
            writesSinceSweep = 0
            for (handle, entry) in sessions where entry.expiresAt <= now {
                sessions[handle] = nil
                userSessions[entry.record.sub]?.remove(handle)
            }
            logins = logins.filter { $0.value.expiresAt > now }
            claims = claims.filter { $0.value > now }
            validations = validations.filter { $0.value.expiresAt > now }
            revoked = revoked.filter { $0.value.expiresAt > now }
            nonces = nonces.filter { $0.value.expiresAt > now }
            ended = ended.filter { $0.value.expiresAt > now }
            for (sub, at) in userExpiry where at <= now { expireUser(sub, now: now) }
        }

        /// Forgets `sub`'s profile and tokens once their expiry has passed.
        mutating func expireUser(_ sub: String, now: Int64) {
            guard let at = userExpiry[sub], at <= now else { return }
            users[sub] = nil
            userTokens[sub] = nil
            userExpiry[sub] = nil
        }

        mutating func wrote(now: Int64) {
            writesSinceSweep += 1
            if writesSinceSweep >= 1024 { sweep(now: now) }
        }
    }

    private let state = NIOLockedValueBox(State())
    private let now: @Sendable () -> Int64

    /// - Parameter now: the clock in Unix milliseconds (injectable for tests).
    public init(now: @escaping @Sendable () -> Int64 = SessionClock.now) {
        self.now = now
    }

    public func create(_ session: SessionRecord, profile: UserProfile, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            s.sessions[session.handle] = (session, expiresAt)
            s.userSessions[session.sub, default: []].insert(session.handle)
            s.expireUser(profile.sub, now: t)
            s.userExpiry[profile.sub] = nil  // a user who signs in again is kept
            s.users[profile.sub] = (s.users[profile.sub] ?? UserProfile(sub: profile.sub)).merged(with: profile)
            s.wrote(now: t)
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func load(_ handle: SessionHandle, on eventLoop: any EventLoop) -> EventLoopFuture<StoredSession?> {
        let t = now()
        let found: StoredSession? = state.withLockedValue { s in
            guard let entry = s.sessions[handle], entry.expiresAt > t else { return nil }
            let sub = entry.record.sub
            s.expireUser(sub, now: t)
            return StoredSession(session: entry.record, user: s.users[sub] ?? UserProfile(sub: sub), revokedAt: s.revoked[sub].flatMap { $0.expiresAt > t ? $0.at : nil },
                                 account: s.links[sub])
        }
        return eventLoop.makeSucceededFuture(found)
    }

    public func touch(_ handle: SessionHandle, lastSeen: Int64, expiresAt: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            if var entry = s.sessions[handle] {
                guard entry.expiresAt > t, expiresAt > t else {
                    s.sessions[handle] = nil
                    s.userSessions[entry.record.sub]?.remove(handle)
                    return
                }
                entry.record.lastSeen = lastSeen
                entry.expiresAt = expiresAt
                s.sessions[handle] = entry
            }
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func delete(_ handle: SessionHandle, sub: String, end: SessionEnd, keep: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            s.sessions[handle] = nil
            s.userSessions[sub]?.remove(handle)
            s.ended[handle] = (end, t + keep)
            s.wrote(now: t)
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func end(of handle: SessionHandle, on eventLoop: any EventLoop) -> EventLoopFuture<SessionEnd?> {
        let t = now()
        return eventLoop.makeSucceededFuture(state.withLockedValue { s in s.ended[handle].flatMap { $0.expiresAt > t ? $0.end : nil } })
    }

    public func sessions(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[SessionRecord]> {
        let t = now()
        let list = state.withLockedValue { s in
            (s.userSessions[sub] ?? []).compactMap { h in s.sessions[h].flatMap { $0.expiresAt > t ? $0.record : nil } }
        }
        return eventLoop.makeSucceededFuture(list.sorted { ($0.created, $0.handle.key) < ($1.created, $1.handle.key) })
    }

    public func revoke(_ sub: String, at revokedAt: Int64, keep: Int64, forget: Forgetting, end: SessionEnd, clients: Set<String>?,
                       on eventLoop: any EventLoop) -> EventLoopFuture<Revocation> {
        let t = now()
        let outcome = state.withLockedValue { s -> Revocation in
            s.expireUser(sub, now: t)
            if clients == nil {
                let earlier = s.revoked[sub].flatMap { $0.expiresAt > t ? $0.at : nil } ?? .min
                s.revoked[sub] = (max(earlier, revokedAt), t + keep)
            }
            var live = 0
            var survives = false
            for h in s.userSessions[sub] ?? [] {
                guard let entry = s.sessions[h] else {
                    s.userSessions[sub]?.remove(h)
                    continue
                }
                guard clients?.contains(entry.record.clientID) ?? true else { continue }  // another app group's
                guard entry.record.created <= revokedAt else {  // signed in again after it
                    survives = entry.expiresAt > t || survives
                    continue
                }
                s.sessions[h] = nil
                s.userSessions[sub]?.remove(h)
                s.ended[h] = (end, t + keep)
                if entry.expiresAt > t { live += 1 }
            }
            if s.userSessions[sub]?.isEmpty == true { s.userSessions[sub] = nil }
            // A session or a token from after the revocation: the user came back since.
            let concerned = { (client: String) in clients?.contains(client) ?? true }
            let superseded = survives || (s.userTokens[sub]?.contains { concerned($0.key) && $0.value.grantedAt > revokedAt } ?? false)
            switch forget {
            case .nothing: break
            case .grants:
                s.userTokens[sub] = s.userTokens[sub]?.filter { !concerned($0.key) || $0.value.grantedAt > revokedAt }
                if s.userTokens[sub]?.isEmpty == true { s.userTokens[sub] = nil }
            case .everything:
                s.users[sub] = nil
                s.userTokens[sub] = nil
                if let account = s.links.removeValue(forKey: sub), s.accounts[account] == sub { s.accounts[account] = nil }
            }
            if !superseded, forget == .grants, clients == nil { s.userExpiry[sub] = t + keep }
            s.wrote(now: t)
            return Revocation(ended: live, superseded: superseded)
        }
        return eventLoop.makeSucceededFuture(outcome)
    }

    public func saveRefreshToken(_ sealed: String, clientID: String, grantedAt: Int64, of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            s.expireUser(sub, now: t)
            s.userTokens[sub, default: [:]][clientID] = (sealed, grantedAt)
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func refreshTokens(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<[String: String]> {
        let t = now()
        return eventLoop.makeSucceededFuture(state.withLockedValue { s in
            s.expireUser(sub, now: t)
            return (s.userTokens[sub] ?? [:]).mapValues(\.sealed)
        })
    }

    public func link(_ sub: String, to account: String, on eventLoop: any EventLoop) -> EventLoopFuture<LinkResult> {
        eventLoop.makeSucceededFuture(state.withLockedValue { s -> LinkResult in
            if let holder = s.accounts[account], holder != sub { return .conflict(sub: holder) }
            if let previous = s.links[sub], previous != account { s.accounts[previous] = nil }
            s.links[sub] = account
            s.accounts[account] = sub
            return .linked
        })
    }

    public func unlink(_ sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        eventLoop.makeSucceededFuture(state.withLockedValue { s -> String? in
            guard let account = s.links.removeValue(forKey: sub) else { return nil }
            if s.accounts[account] == sub { s.accounts[account] = nil }
            return account
        })
    }

    public func account(linkedTo sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        eventLoop.makeSucceededFuture(state.withLockedValue { $0.links[sub] })
    }

    public func putJob(_ job: OutboxJob, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        state.withLockedValue { $0.jobs[job.id] = job }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func jobs(on eventLoop: any EventLoop) -> EventLoopFuture<[OutboxJob]> {
        eventLoop.makeSucceededFuture(state.withLockedValue { Array($0.jobs.values) })
    }

    public func putNonce(_ hash: String, clientID: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            s.nonces[hash] = (clientID, t + ttl)
            s.wrote(now: t)
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func takeNonce(_ hash: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        let t = now()
        return eventLoop.makeSucceededFuture(state.withLockedValue { s in s.nonces.removeValue(forKey: hash).flatMap { $0.expiresAt > t ? $0.clientID : nil } })
    }

    public func job(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<OutboxJob?> {
        eventLoop.makeSucceededFuture(state.withLockedValue { $0.jobs[id] })
    }

    public func removeJob(id: String, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        state.withLockedValue { _ = $0.jobs.removeValue(forKey: id) }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func saveProfile(_ profile: UserProfile, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            s.expireUser(profile.sub, now: t)
            s.users[profile.sub] = (s.users[profile.sub] ?? UserProfile(sub: profile.sub)).merged(with: profile)
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func profile(of sub: String, on eventLoop: any EventLoop) -> EventLoopFuture<UserProfile?> {
        let t = now()
        return eventLoop.makeSucceededFuture(state.withLockedValue { s in
            s.expireUser(sub, now: t)
            return s.users[sub]
        })
    }

    public func users(on eventLoop: any EventLoop) -> EventLoopFuture<[String]> {
        let t = now()
        return eventLoop.makeSucceededFuture(state.withLockedValue { s in
            for sub in Array(s.userExpiry.keys) { s.expireUser(sub, now: t) }
            return Array(s.users.keys)
        })
    }

    public func putTransfer(_ record: TransferRecord, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            let current = s.transfers[record.id].flatMap { $0.expiresAt > t ? $0.record : nil } ?? TransferRecord(id: record.id)
            s.transfers[record.id] = (current.merged(with: record), t + TransferRecord.lifetime)
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func transfer(_ id: String, on eventLoop: any EventLoop) -> EventLoopFuture<TransferRecord?> {
        let t = now()
        return eventLoop.makeSucceededFuture(state.withLockedValue { s in s.transfers[id].flatMap { $0.expiresAt > t ? $0.record : nil } })
    }

    public func transfers(on eventLoop: any EventLoop) -> EventLoopFuture<[TransferRecord]> {
        let t = now()
        return eventLoop.makeSucceededFuture(state.withLockedValue { s in s.transfers.values.filter { $0.expiresAt > t }.map(\.record) })
    }

    public func putLogin(state key: String, _ login: LoginState, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            s.logins[key] = (login, t + ttl)
            s.wrote(now: t)
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func takeLogin(state key: String, on eventLoop: any EventLoop) -> EventLoopFuture<LoginState?> {
        let t = now()
        let login = state.withLockedValue { s in s.logins.removeValue(forKey: key).flatMap { $0.expiresAt > t ? $0.login : nil } }
        return eventLoop.makeSucceededFuture(login)
    }

    public func claim(_ claim: Claim, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Bool> {
        let id = claim.name
        let t = now()
        let first = state.withLockedValue { s -> Bool in
            if let until = s.claims[id], until > t { return false }
            s.claims[id] = t + ttl
            s.wrote(now: t)
            return true
        }
        return eventLoop.makeSucceededFuture(first)
    }

    public func release(_ claim: Claim, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        state.withLockedValue { _ = $0.claims.removeValue(forKey: claim.name) }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func validation(of tokenHash: String, on eventLoop: any EventLoop) -> EventLoopFuture<ValidationRecord?> {
        let t = now()
        return eventLoop.makeSucceededFuture(state.withLockedValue { s in s.validations[tokenHash].flatMap { $0.expiresAt > t ? $0.record : nil } })
    }

    public func recordValidation(_ record: ValidationRecord, of tokenHash: String, ttl: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        let t = now()
        state.withLockedValue { s in
            s.validations[tokenHash] = (record, t + ttl)
            s.wrote(now: t)
        }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func markValidated(_ handle: SessionHandle, at: Int64, on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        state.withLockedValue { s in s.sessions[handle]?.record.validatedAt = at }
        return eventLoop.makeSucceededVoidFuture()
    }

    public func swapReturnURL(_ url: String, on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        eventLoop.makeSucceededFuture(state.withLockedValue { s in
            defer { s.returnURL = url }
            return s.returnURL
        })
    }

    public func returnURL(on eventLoop: any EventLoop) -> EventLoopFuture<String?> {
        eventLoop.makeSucceededFuture(state.withLockedValue { $0.returnURL })
    }

    public func ping(on eventLoop: any EventLoop) -> EventLoopFuture<Void> {
        eventLoop.makeSucceededVoidFuture()
    }
}

/// Wall-clock time in Unix milliseconds, the unit of every stored time.
public enum SessionClock {
    @Sendable public static func now() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }
}
