import Foundation
import GatewayConfig
import Sessions

/// The sending team's half of a transfer.
extension Migration {
    /// For every user the store knows: their transfer id for team `target`, a line in `file`
    /// with what the recipient needs, and a line in the sending team's own mapping beside it
    /// (`TransferMapping`). Resumable: users already in the file are skipped, and an id this
    /// store already holds for `target` is not asked for again (an id is only good for the team
    /// it was asked for: another target asks Apple again). A file made for another team is
    /// refused. Each run renews the store's records (`TransferRecord.lifetime`).
    public func export(target: String, to file: String) async throws -> ExportReport {
        guard GatewayConfiguration.Apple.isIdentifier(target) else { throw MigrationError("--target \(target): not a Team ID (ten upper-case letters and digits)") }
        guard target != configuration.apple?.teamID else { throw MigrationError("--target \(target) is this configuration's own apple.team_id") }
        var inFile = Set<String>()
        if FileManager.default.fileExists(atPath: file) {
            for (number, line) in try TransferLine.lines(of: file) {
                switch TransferLine.parse(line) {
                case .success(let parsed): inFile.insert(parsed.transferSubject)
                case .failure(let error): throw MigrationError("\(file):\(number): \(error) (not a transfer file; refusing to append to it)")
                }
            }
        }
        let mapping = try TransferMapping(beside: file, target: target)
        var known: [String: String] = [:]  // sub → transfer id for `target` this store already holds
        // A record written before ids were kept per team (no `target`) counts only when this very
        // file holds its id: the file was made for one team, so the id is that team's.
        for record in try await store.transfers(on: loop).get() where record.target == target || (record.target == nil && inFile.contains(record.id)) {
            if let from = record.from { known[from] = record.id }
        }
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
            if let id = known[sub], inFile.contains(id) {
                // Renewed: an export made long before the transfer still reaches the end of the window.
                do { try await store.putTransfer(TransferRecord(id: id, from: sub, target: target), on: loop).get() } catch { report.failed.append(sub); continue }
                try mapping.add(sub: sub, transferSubject: id)  // a run stopped between the two files
                report.alreadyInFile += 1
                continue
            }
            var id = known[sub]
            if id == nil {
                let (outcome, calls) = try await callWithAccess(token) { [tokens, clientID] access in
                    await tokens.transferSubject(of: sub, target: target, clientID: clientID, accessToken: access)
                }
                report.appleCalls += calls
                switch outcome {
                case .transferSubject(let transferSubject): id = transferSubject
                case .refused: report.refused.append(sub); continue
                case .clientMisconfigured(let error): throw MigrationError("Apple refused our client credentials (\(error)) after \(report.exported) users; nothing else was asked")
                case .transient, .subject: report.failed.append(sub); continue
                }
                // The store first: a run that stops before the line is written writes it next time without asking Apple.
                do { try await store.putTransfer(TransferRecord(id: id!, from: sub, target: target), on: loop).get() } catch { report.failed.append(sub); continue }
            }
            guard let id else { continue }
            known[sub] = id
            if inFile.contains(id) {  // asked again for a record of an earlier version (no target): the same id
                try mapping.add(sub: sub, transferSubject: id)
                report.alreadyInFile += 1
                continue
            }
            do {
                let line = try await exportLine(sub: sub, transferSubject: id)
                try output.write(contentsOf: Data((line.json + "\n").utf8))
                try mapping.add(sub: sub, transferSubject: id)
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
}
