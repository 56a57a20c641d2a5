-- pglease.GrantSQL: the role name is empty
DO $pglease$
BEGIN
	RAISE EXCEPTION 'pglease.GrantSQL: the role name is empty';
END
$pglease$;
-- pglease.GrantSQL: role "public" would be every role: name an application role
DO $pglease$
BEGIN
	RAISE EXCEPTION 'pglease.GrantSQL: role "public" would be every role: name an application role';
END
$pglease$;
