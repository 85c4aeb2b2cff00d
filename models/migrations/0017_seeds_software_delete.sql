-- Deleting a software deployment runs UNDEPLOY on its server first (Heat
-- maps UNDEPLOY to DELETE): the row stays, marked deleting, until its
-- UNDEPLOY round is signalled or times out, then the workflow removes it.
ALTER TABLE software_deployments
    ADD COLUMN deleting boolean NOT NULL DEFAULT false;
