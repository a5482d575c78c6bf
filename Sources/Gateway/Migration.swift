import AppleID
import AsyncHTTPClient
import Foundation
import GatewayConfig
import Logging
import NIOCore
import NIOPosix
import Sessions

/// One user in a transfer file (JSON Lines): what the sending team hands the recipient. As
/// Apple asks (TN3159), it names the user by the transfer id only — never the sending team's
/// `sub` or private relay address, which mean nothing (and must not be shown) to another team.
public struct TransferLine: Sendable, Equatable {
    public var transferSubject: String
    /// The legacy account linked to the user.
    public var account: String?
    public var name: String?
    /// A real (non-relay) address only.
    public var email: String?
    public var emailVerified: Bool?
    public var realUserStatus: Int?
    /// The routes whose `allow.users` named the user at the sending team.
    public var routes: [String]

    public init(transferSubject: String, account: String? = nil, name: String? = nil, email: String? = nil, emailVerified: Bool? = nil,
                realUserStatus: Int? = nil, routes: [String] = []) {
        self.transferSubject = transferSubject
        self.account = account
        self.name = name
        self.email = email
        self.emailVerified = emailVerified
        self.realUserStatus = realUserStatus
        self.routes = routes
    }

    /// Parses one line; nil with the reason when it is not a transfer line.
    public static func parse(_ line: String) -> Result<TransferLine, MigrationError> {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] else {
            return .failure(MigrationError("not a JSON object"))
        }
        guard let id = object["transfer_sub"] as? String, !id.isEmpty, id.utf8.count <= 256 else { return .failure(MigrationError("transfer_sub is missing")) }
        let routes = object["routes"] as? [String] ?? []
        if let account = object["account"] as? String, !AuthEndpointGuard.isAccountID(account) {
            return .failure(MigrationError("account is not an account id (printable, at most \(AuthEndpointGuard.maximumAccountLength) bytes)"))
        }
        return .success(TransferLine(transferSubject: id, account: object["account"] as? String, name: object["name"] as? String,
                                     email: object["email"] as? String, emailVerified: object["email_verified"] as? Bool,
                                     realUserStatus: (object["real_user_status"] as? NSNumber)?.intValue, routes: routes))
    }

    public var json: String {
        var object: [String: Any] = ["transfer_sub": transferSubject]
        if let account { object["account"] = account }
        if let name { object["name"] = name }
        if let email { object["email"] = email }
        if let emailVerified { object["email_verified"] = emailVerified }
        if let realUserStatus { object["real_user_status"] = realUserStatus }
        if !routes.isEmpty { object["routes"] = routes }
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }
}

public struct MigrationError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// What `migrate export` did.
public struct ExportReport: Sendable, Equatable {
    /// Lines written by this run (Apple asked, or an id this store already held).
    public var exported = 0
    /// Users the file already held (an earlier run).
    public var alreadyInFile = 0
    /// Apple refused the user (`invalid_request`: consent revoked, or unknown to Apple).
    public var refused: [String] = []
    /// Apple or the store did not answer after retries: run the export again.
    public var failed: [String] = []
    public var appleCalls = 0
}

/// What `migrate import` did.
public struct ImportReport: Sendable, Equatable {
    public var moved = 0
    /// Lines an earlier run (or the user's sign-in) already mapped.
    public var alreadyMapped = 0
    /// Apple refused the transfer id (`invalid_request`: consent revoked, wrong team, or outside
    /// the 60-day transfer period).
    public var refused: [String] = []
    /// Apple or the store did not answer after retries: run the import again (or the user is
    /// mapped at their next sign-in).
    public var failed: [String] = []
    public var sessionsEnded = 0
    public var linksMoved = 0
    /// Transfer ids whose account is already linked to another identity here: not linked.
    public var linkConflicts: [String] = []
    /// Route name → the users (new `sub`s) its `allow.users` should name, with the entry they
    /// replace when this store knew it.
    public var allowListChanges: [String: [AllowListChange]] = [:]
    public var appleCalls = 0
}

public struct AllowListChange: Sendable, Equatable {
    public var sub: String
    /// The sending team's `sub` the config may still name (then it keeps matching until replaced).
    public var replaces: String?
}

/// A minimum spacing between calls (`--rate` per second).
actor Pacer {
    private let interval: Duration
    private var next = ContinuousClock.now

    init(perSecond: Double) { interval = .nanoseconds(Int64(1_000_000_000 / max(perSecond, 0.001))) }

    func wait() async throws {
        let now = ContinuousClock.now
        let slot = max(next, now)
        next = slot + interval
        if slot > now { try await Task.sleep(until: slot, clock: .continuous) }
    }
}

/// App transfers (TN3159; README "Existing accounts and app transfers"). The sending team runs
/// `export` with its key; the recipient runs `import` with its own; the gateway maps at sign-in
/// anyone an import did not reach (`TransferArrival`).
public struct Migration: Sendable {
    let configuration: GatewayConfiguration
    let store: any SessionStore
    let apple: AppleServices
    let clientID: String
    let publish: @Sendable (FleetMessage) async -> Void
    let pacer: Pacer
    let loop: any EventLoop
    let retryDelay: Duration

    /// - Parameters:
    ///   - publish: tells running gateways to drop a user's sessions from their caches.
    ///   - perSecond: Apple calls per second at most.
    public init(configuration: GatewayConfiguration, store: any SessionStore, httpClient: HTTPClient, clientID: String? = nil, perSecond: Double = 10,
                retryDelay: Duration = .seconds(1), logger: Logger, publish: @escaping @Sendable (FleetMessage) async -> Void = { _ in }) throws {
        guard let a = configuration.apple else { throw MigrationError("the configuration has no apple: section") }
        self.configuration = configuration
        self.store = store
        self.apple = try AppleServices(configuration: a, httpClient: httpClient, logger: logger)
        if let clientID, !a.clientIDs.contains(clientID) { throw MigrationError("--client-id \(clientID) is not one of apple.client_ids") }
        self.clientID = clientID ?? a.clientIDs[0]
        self.publish = publish
        self.pacer = Pacer(perSecond: perSecond)
        self.loop = MultiThreadedEventLoopGroup.singleton.next()
        self.retryDelay = retryDelay
    }

    /// The migration endpoint's access token, renewed five minutes before Apple says it expires.
    final class AccessToken: @unchecked Sendable {
        var value = ""
        var renewAt = ContinuousClock.now
    }

    private func accessToken(_ current: AccessToken) async throws -> String {
        if ContinuousClock.now < current.renewAt { return current.value }
        for attempt in 0..<3 {
            switch await apple.tokens.migrationAccessToken(clientID: clientID) {
            case .success(let tokens):
                current.value = tokens.accessToken
                current.renewAt = ContinuousClock.now + .seconds(max((tokens.expiresIn ?? 3600) - 300, 60))
                return tokens.accessToken
            case .clientMisconfigured(let error):
                throw MigrationError("Apple refused our client credentials (\(error)): check apple.team_id, key_id, private_key_file and client_ids (sessiongate check --online)")
            case .grantRevoked(let error): throw MigrationError("Apple refused the client_credentials grant (\(error))")
            case .transient(let reason, let retryAfter):
                if attempt == 2 { throw MigrationError("Apple did not answer: \(reason); run again") }
                try await Task.sleep(for: retryAfter.map { .seconds(min($0, 60)) } ?? retryDelay * (1 << attempt))
            }
        }
        throw MigrationError("unreachable")
    }

    /// One migration call, paced, retried on transient failures (3 attempts).
    private func call(_ body: () async -> AppleMigrationOutcome) async throws -> AppleMigrationOutcome {
        var outcome = AppleMigrationOutcome.transient(reason: "not attempted")
        for attempt in 0..<3 {
            try await pacer.wait()
            outcome = await body()
            guard case .transient(_, let retryAfter) = outcome, attempt < 2 else { return outcome }
            try await Task.sleep(for: retryAfter.map { .seconds(min($0, 60)) } ?? retryDelay * (1 << attempt))
        }
        return outcome
    }

    // MARK: export (the sending team)

    /// For every user the store knows: their transfer id for team `target`, and a line in
    /// `file` with what the recipient needs. Resumable: users already in the file are skipped,
    /// and an id this store already holds is not asked for again.
    public func export(target: String, to file: String) async throws -> ExportReport {
        guard GatewayConfiguration.Apple.isIdentifier(target) else { throw MigrationError("--target \(target): not a Team ID (ten upper-case letters and digits)") }
        guard target != configuration.apple?.teamID else { throw MigrationError("--target \(target) is this configuration's own apple.team_id") }
        var inFile = Set<String>()
        if FileManager.default.fileExists(atPath: file) {
            for (number, line) in try Self.lines(of: file) {
                switch TransferLine.parse(line) {
                case .success(let parsed): inFile.insert(parsed.transferSubject)
                case .failure(let error): throw MigrationError("\(file):\(number): \(error) (not a transfer file; refusing to append to it)")
                }
            }
        }
        var known: [String: String] = [:]  // sub → transfer id this store already holds
        for record in try await store.transfers(on: loop).get() { if let from = record.from { known[from] = record.id } }
        let users = Set(try await store.users(on: loop).get()).sorted()  // SCAN may name a key twice
        guard let output = FileHandle(forWritingAtPath: file) ?? (FileManager.default.createFile(atPath: file, contents: nil, attributes: [.posixPermissions: 0o600])
                                                                  ? FileHandle(forWritingAtPath: file) : nil) else {
            throw MigrationError("\(file): cannot write")
        }
        defer { try? output.close() }
        try output.seekToEnd()
        var report = ExportReport()
        let token = AccessToken()
        if let size = try? FileManager.default.attributesOfItem(atPath: file)[.size] as? Int, size > 0,
           let handle = FileHandle(forReadingAtPath: file) {
            // A file whose last line lacks its newline (edited by hand): end it before appending.
            try handle.seek(toOffset: UInt64(size - 1))
            if handle.readData(ofLength: 1) != Data("\n".utf8) { try output.write(contentsOf: Data("\n".utf8)) }
            try? handle.close()
        }
        for sub in users {
            if let id = known[sub], inFile.contains(id) { report.alreadyInFile += 1; continue }
            var id = known[sub]
            if id == nil {
                let access = try await accessToken(token)
                report.appleCalls += 1
                switch try await call({ await apple.tokens.transferSubject(of: sub, target: target, clientID: clientID, accessToken: access) }) {
                case .transferSubject(let transferSubject): id = transferSubject
                case .refused: report.refused.append(sub); continue
                case .clientMisconfigured(let error): throw MigrationError("Apple refused our client credentials (\(error)) after \(report.exported) users; nothing else was asked")
                case .transient, .subject: report.failed.append(sub); continue
                }
                // The store first: a run that stops before the line is written writes it next time without asking Apple.
                do { try await store.putTransfer(TransferRecord(id: id!, from: sub), on: loop).get() } catch { report.failed.append(sub); continue }
            }
            guard let id, !inFile.contains(id) else { continue }
            known[sub] = id
            do {
                let line = try await exportLine(sub: sub, transferSubject: id)
                try output.write(contentsOf: Data((line.json + "\n").utf8))
                inFile.insert(id)
                report.exported += 1
            } catch let failure as MigrationError {
                throw failure
            } catch {
                report.failed.append(sub)
            }
        }
        return report
    }

    /// What the recipient needs about `sub`: never the sub or a relay address.
    func exportLine(sub: String, transferSubject: String) async throws -> TransferLine {
        let profile = try await store.profile(of: sub, on: loop).get()
        let account = try await store.account(linkedTo: sub, on: loop).get()
        let routes = configuration.routes.filter { $0.allow.users.contains(sub) }.map(\.name)
        return TransferLine(transferSubject: transferSubject, account: account, name: profile?.name,
                            email: profile?.privateEmail == false ? profile?.email : nil,
                            emailVerified: profile?.privateEmail == false ? profile?.emailVerified : nil,
                            realUserStatus: profile?.realUserStatus, routes: routes)
    }

    // MARK: import (the recipient)

    /// Loads every line of `file` into the store (so a sign-in can map anyone the batch does not
    /// reach), then exchanges each transfer id not yet mapped for the user's `sub` here and moves
    /// the user to it. Resumable: mapped lines are skipped. The file is read whole first: a
    /// malformed line stops the import before anything changes.
    public func importFile(_ file: String) async throws -> ImportReport {
        var rows: [TransferLine] = []
        var seen = Set<String>()
        for (number, line) in try Self.lines(of: file) {
            switch TransferLine.parse(line) {
            case .success(let row): if seen.insert(row.transferSubject).inserted { rows.append(row) }
            case .failure(let error): throw MigrationError("\(file):\(number): \(error); nothing was imported")
            }
        }
        var report = ImportReport()
        var pending: [TransferLine] = []
        for row in rows {
            let record = try await store.transfer(row.transferSubject, on: loop).get()
            if let to = record?.to {
                report.alreadyMapped += 1
                note(row, record: record, to: to, in: &report)
                continue
            }
            try await store.putTransfer(TransferRecord(id: row.transferSubject, data: row.json), on: loop).get()
            pending.append(row)
        }
        guard !pending.isEmpty else { return report }
        let token = AccessToken()
        for row in pending {
            let access = try await accessToken(token)
            report.appleCalls += 1
            switch try await call({ await apple.tokens.exchange(transferSubject: row.transferSubject, clientID: clientID, accessToken: access) }) {
            case .subject(let sub, let email, let privateEmail):
                do {
                    guard let record = try await store.transfer(row.transferSubject, on: loop).get() else { report.failed.append(row.transferSubject); continue }
                    if let to = record.to {  // the user signed in meanwhile
                        report.alreadyMapped += 1
                        note(row, record: record, to: to, in: &report)
                        continue
                    }
                    guard let outcome = try await TransferArrival.apply(record, to: sub, email: email, privateEmail: privateEmail, store: store,
                                                                        keep: Authenticator.milliseconds(configuration.session.absoluteTimeout), on: loop) else {
                        report.failed.append(row.transferSubject)  // a sign-in is moving them right now: the next run sees it done
                        continue
                    }
                    // Running gateways drop both identities from their caches: the old one's
                    // sessions ended, the new one's (if any) gain the link.
                    if let from = record.from { await publish(.user(from)) }
                    await publish(.user(sub))
                    report.moved += 1
                    report.sessionsEnded += outcome.sessionsEnded
                    if outcome.account != nil { report.linksMoved += 1 }
                    if outcome.linkConflict { report.linkConflicts.append(row.transferSubject) }
                    note(row, record: record, to: sub, in: &report)
                } catch {
                    report.failed.append(row.transferSubject)
                }
            case .refused: report.refused.append(row.transferSubject)
            case .clientMisconfigured(let error): throw MigrationError("Apple refused our client credentials (\(error)) after \(report.moved) users; run again once fixed")
            case .transient, .transferSubject: report.failed.append(row.transferSubject)
            }
        }
        return report
    }

    /// The allow-list entries the mapped user should have.
    private func note(_ row: TransferLine, record: TransferRecord?, to sub: String, in report: inout ImportReport) {
        for route in configuration.routes {
            let namedBefore = row.routes.contains(route.name) || record?.from.map(route.allow.users.contains) == true
            guard namedBefore, !route.allow.users.contains(sub) else { continue }
            report.allowListChanges[route.name, default: []].append(AllowListChange(sub: sub, replaces: record?.from.flatMap { route.allow.users.contains($0) ? $0 : nil }))
        }
    }

    /// The non-empty lines of a file with their numbers.
    static func lines(of file: String) throws -> [(Int, String)] {
        guard let data = FileManager.default.contents(atPath: file) else { throw MigrationError("\(file): cannot read") }
        return String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).enumerated()
            .compactMap { index, line in line.trimmingCharacters(in: .whitespaces).isEmpty ? nil : (index + 1, String(line)) }
    }
}

/// Moves one transferred user to their `sub` at the recipient team: by `migrate import`, or at
/// their first sign-in there when the identity token's `transfer_sub` names a record the import
/// did not map. Idempotent.
enum TransferArrival {
    struct Outcome {
        var sessionsEnded = 0
        var account: String?
        var linkConflict = false
    }

    /// - Parameters:
    ///   - email: the new relay address Apple gave (relay users only).
    ///   - keep: how long the old identity's revocation marker lasts (the absolute timeout).
    /// Answers nil when another process (an import, a sign-in) is moving the same user now.
    static func apply(_ record: TransferRecord, to sub: String, email: String?, privateEmail: Bool, store: any SessionStore, keep: Int64,
                      on loop: any EventLoop) async throws -> Outcome? {
        // One mover at a time per user: the import and a sign-in may meet here.
        guard try await store.claim(.transfer(id: record.id), ttl: 60_000, on: loop).get() else { return nil }
        do {
            let outcome = try await move(record, to: sub, email: email, privateEmail: privateEmail, store: store, keep: keep, on: loop)
            try? await store.release(.transfer(id: record.id), on: loop).get()
            return outcome
        } catch {
            try? await store.release(.transfer(id: record.id), on: loop).get()
            throw error
        }
    }

    private static func move(_ record: TransferRecord, to sub: String, email: String?, privateEmail: Bool, store: any SessionStore, keep: Int64,
                             on loop: any EventLoop) async throws -> Outcome {
        if let to = try await store.transfer(record.id, on: loop).get()?.to, to == sub { return Outcome() }  // done while we waited
        let line = record.data.flatMap { try? TransferLine.parse($0).get() }
        // What this store knew under the old sub (the same operator on both sides), else the file's.
        let old = try await record.from.asyncMap { try await store.profile(of: $0, on: loop).get() } ?? nil
        var profile = UserProfile(sub: sub, name: old?.name ?? line?.name, realUserStatus: old?.realUserStatus ?? line?.realUserStatus, formerSub: record.from)
        if let email {
            // Apple's: the exchange's new relay address, or the signed token's at a sign-in.
            (profile.email, profile.emailVerified, profile.privateEmail) = (email, true, privateEmail)
        } else if let known = old?.privateEmail == false ? old?.email : line?.email {
            (profile.email, profile.emailVerified, profile.privateEmail) = (known, old?.emailVerified ?? line?.emailVerified, false)
        }
        // Fields the new identity already has (its sign-in's) win.
        let existing = try await store.profile(of: sub, on: loop).get()
        try await store.saveProfile(existing.map { profile.merged(with: $0) } ?? profile, on: loop).get()

        var outcome = Outcome()
        let oldAccount = try await record.from.asyncMap { try await store.account(linkedTo: $0, on: loop).get() } ?? nil
        let current = try await store.account(linkedTo: sub, on: loop).get()
        if let account = oldAccount ?? line?.account {
            if let current, current != account {
                outcome.linkConflict = true  // the new identity is already linked elsewhere: kept, reported
            } else if current == nil {
                if let from = record.from, oldAccount != nil { _ = try await store.unlink(from, on: loop).get() }
                do {
                    switch try await store.link(sub, to: account, on: loop).get() {
                    case .linked: outcome.account = account
                    case .conflict: outcome.linkConflict = true
                    }
                } catch {
                    // Put the old link back rather than lose it (it moves at the next attempt).
                    if let from = record.from, oldAccount != nil { _ = try? await store.link(from, to: account, on: loop).get() }
                    throw error
                }
            } else {
                outcome.account = account
            }
        }
        if let from = record.from {
            // The old sessions' refresh tokens belong to the old team: they end, and the old
            // identity's profile and tokens go with them.
            outcome.sessionsEnded = try await store.revoke(from, at: SessionClock.now(), keep: keep, forget: true, on: loop).get()
        }
        try await store.putTransfer(TransferRecord(id: record.id, to: sub, mappedAt: SessionClock.now()), on: loop).get()
        return outcome
    }
}

extension Optional {
    func asyncMap<T>(_ transform: (Wrapped) async throws -> T) async rethrows -> T? {
        switch self {
        case .some(let value): return try await transform(value)
        case .none: return nil
        }
    }
}

extension ExportReport {
    /// What the operator reads (no sub of a user who moved: those stay in the store).
    public func summary(file: String) -> [String] {
        var lines = ["exported \(exported) user\(exported == 1 ? "" : "s") to \(file)" + (alreadyInFile > 0 ? " (\(alreadyInFile) already in it from an earlier run)" : "")
                     + "; \(appleCalls) call\(appleCalls == 1 ? "" : "s") to Apple"]
        if !refused.isEmpty {
            lines.append("\(refused.count) refused by Apple (consent revoked or unknown to Apple; they cannot move): " + refused.joined(separator: " "))
        }
        if !failed.isEmpty { lines.append("\(failed.count) not exported (Apple or the store did not answer): run the same command again to finish") }
        return lines
    }
}

extension ImportReport {
    /// What the operator reads, with the `allow.users` entries to put in the configuration.
    public var summary: [String] {
        var lines = ["moved \(moved) user\(moved == 1 ? "" : "s") (\(sessionsEnded) old session\(sessionsEnded == 1 ? "" : "s") ended, \(linksMoved) link\(linksMoved == 1 ? "" : "s") moved)"
                     + (alreadyMapped > 0 ? "; \(alreadyMapped) already mapped" : "") + "; \(appleCalls) call\(appleCalls == 1 ? "" : "s") to Apple"]
        if !linkConflicts.isEmpty {
            lines.append("\(linkConflicts.count) not linked: the account is linked to another Apple identity here (transfer ids: \(linkConflicts.joined(separator: " ")))")
        }
        if !refused.isEmpty {
            lines.append("\(refused.count) refused by Apple (consent revoked, another team's ids, or outside the 60-day transfer period): " + refused.joined(separator: " "))
        }
        if !failed.isEmpty {
            lines.append("\(failed.count) not mapped yet (Apple or the store did not answer): run the same command again; meanwhile each is mapped at their next sign-in")
        }
        for route in allowListChanges.keys.sorted() {
            lines.append("routes[\(route)].allow.users should name:")
            for change in allowListChanges[route]! {
                lines.append("  - \"\(change.sub)\"" + (change.replaces.map { "   # replaces \"\($0)\" (which keeps matching this user until you replace it)" } ?? ""))
            }
        }
        return lines
    }
}

/// `sessiongate check --transfer`: what an operator runs before, during and after an app
/// transfer, with where this store stands (Redis only: the memory store lives in the gateway).
public enum TransferChecklist {
    /// - Parameter store: nil when there is none to read, with the reason.
    public static func lines(_ c: GatewayConfiguration, store: Result<any SessionStore, MigrationError>) async -> [String] {
        let team = c.apple?.teamID ?? "(no apple: section)"
        var state: (users: Int, exported: Int, loaded: Int, mapped: Int, stale: [String])? = nil
        var unavailable: String? = nil
        switch store {
        case .failure(let reason): unavailable = reason.description
        case .success(let store):
            let loop = MultiThreadedEventLoopGroup.singleton.next()
            do {
                let users = try await store.users(on: loop).get(), records = try await store.transfers(on: loop).get()
                var stale: [String] = []
                for record in records {
                    guard let from = record.from, let to = record.to else { continue }
                    for route in c.routes where route.allow.users.contains(from) && !route.allow.users.contains(to) {
                        stale.append("routes[\(route.name)].allow.users: replace \"\(from)\" with \"\(to)\"")
                    }
                }
                state = (users.count, records.filter { $0.from != nil }.count, records.filter { $0.data != nil }.count, records.filter { $0.to != nil }.count, stale.sorted())
            } catch {
                unavailable = "the store did not answer: \(error)"
            }
        }
        func status(_ text: String) -> String { state == nil ? "" : "   [\(text)]" }
        var lines = [
            "App transfer checklist (TN3159; README \"Existing accounts and app transfers\"). This configuration is team \(team).",
            unavailable.map { "(no progress shown: \($0))" } ?? "",
            "Before the transfer (or within the 60 days after): the sending team, with its own configuration",
            "  1. Ungroup the app from any Sign in with Apple app group (App Store Connect refuses the transfer otherwise).",
            "  2. sessiongate migrate export --config <sending team's file> --target <recipient Team ID> --out transfer.jsonl",
            "     Run it again until it reports no failures (users who revoked consent stay refused); it resumes.\(status("this store: \(state?.exported ?? 0) of \(state?.users ?? 0) users exported"))",
            "  3. Give transfer.jsonl to the recipient: it names users by transfer id only (no sub, no relay address).",
            "During the 60 days after the transfer: the recipient",
            "  4. Its own apple: section (team_id, key_id, private_key_file) with the app's client_ids; sessiongate check --online.",
            "  5. sessiongate migrate import --config <recipient's file> transfer.jsonl",
            "     Run it again until it reports no failures; put the allow.users entries it prints in the file and reload (SIGHUP).\(status("this store: \(state?.mapped ?? 0) mapped of \(max(state?.loaded ?? 0, state?.mapped ?? 0)) loaded"))",
            "  6. What users see: their session ends once; they sign in with Apple again (no new consent screen) and reach the same",
            "     account. Anyone the import has not mapped yet is mapped at that sign-in (Apple's token carries transfer_sub).",
            "After day 60",
            "  7. Apple refuses every exchange and stops sending transfer_sub: a user never mapped arrives as a new user. Run the",
            "     import a last time before then.",
            "  8. Replace allow.users entries that still name a former sub (they keep matching the mapped user meanwhile).",
        ].filter { !$0.isEmpty }
        lines += (state?.stale ?? []).map { "     \($0)" }
        return lines
    }
}
